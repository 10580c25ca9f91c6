"""Notebook 11's replica tools: planted mistakes (PLANTED, run by
test_registry.py, which also checks every reference and stub), each of
which must get the hint that names it. The first group of each exercise
breaks one property each of those the checker's docstring lists; the second
group are mistakes found by trying the exercise again, after the checker
was written."""
import torch
import torch.distributed as dist


# ---- differing_tensors ------------------------------------------------------------

def _gathered(tensor):
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, tensor.detach().contiguous())
    return copies


def _bytes_equal(a, b):
    return torch.equal(a.flatten().view(torch.uint8), b.flatten().view(torch.uint8))


def compares_sums(model):
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if len({s.item() for s in _gathered(t.detach().double().nan_to_num().sum())}) > 1]


def compares_with_allclose(model):
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if not all(torch.allclose(c, t, equal_nan=True) for c in _gathered(t))]


def parameters_only(model):
    return [name for name, t in model.named_parameters()
            if not all(_bytes_equal(c, t) for c in _gathered(t))]


def against_rank_0_only_on_rank_0(model):
    """Each rank compares its own copy with rank 0's broadcast: rank 0 never
    sees a difference, the others see only their own."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        reference = t.detach().clone()
        dist.broadcast(reference, src=0)
        if not _bytes_equal(reference, t):
            found.append(name)
    return found


def nan_is_never_equal(model):
    """The natural torch.equal: a NaN on every rank reads as a difference."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if not all(torch.equal(c, t) for c in _gathered(t))]


# second attempt: mistakes of our own, not in the list above

def compares_norms(model):
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        norms = _gathered(t.detach().float().nan_to_num().norm().reshape(1))
        if any(not torch.equal(n, norms[0]) for n in norms):
            found.append(name)
    return found


def max_minus_min_with_all_reduce(model):
    """all_reduce MAX and MIN, and compare: NaN poisons both, and the
    difference of a swapped row is still caught; the one-bit bias too, but
    NaN - NaN is NaN, never 0."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        high, low = t.detach().clone(), t.detach().clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if not torch.equal(high, low):
            found.append(name)
    return found


# tried as a learner would (issues 34 and 38)

def compares_hashes_of_bytes(model):
    """hash() of each tensor's bytes, gathered: right in one forked server
    (one hash seed), wrong under torchrun (a seed per process)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        digests = [None] * dist.get_world_size()
        dist.all_gather_object(digests, hash(t.detach().numpy().tobytes()))
        if len(set(digests)) > 1:
            found.append(name)
    return found


def nan_to_num_then_equal(model):
    """A NaN made a number first: equal NaNs agree, but so does a NaN on
    one rank with a 0.0 on the others."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named
            if not all(torch.equal(c, t.detach().nan_to_num())
                       for c in _gathered(t.detach().nan_to_num()))]


def sha256_digests(model):
    """Right, in another style: a digest that does not depend on the process."""
    import hashlib
    named = list(model.named_parameters()) + list(model.named_buffers())
    found = []
    for name, t in named:
        digest = hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()
        digests = [None] * dist.get_world_size()
        dist.all_gather_object(digests, digest)
        if len(set(digests)) > 1:
            found.append(name)
    return found


def int_views_reduced(model):
    """Right, in another style: the bits as integers, all-reduced MAX and
    MIN (integers have no NaN, so equal bits give equal extremes)."""
    found = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        bits = t.detach().flatten().view(torch.int32).long()
        high, low = bits.clone(), bits.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if not torch.equal(high, low):
            found.append(name)
    return found


def flags_gathered_async_never_waited(loss):
    """Right when the all-gather happens to land before it is read."""
    flag = torch.tensor([float(not torch.isfinite(loss.detach()))])
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, flag, async_op=True)
    return [r for r, f in enumerate(flags) if f.item() == 1.0]


def flags_gathered_async_and_waited(loss):
    """Right, in another style: an async all-gather of int flags, waited."""
    flag = (~torch.isfinite(loss.detach())).to(torch.int64).reshape(1)
    flags = [torch.empty_like(flag) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, flag, async_op=True).wait()
    return torch.cat(flags).nonzero().flatten().tolist()


def test_nonfinite_ranks_with_a_waited_async_gather_passes(verdict):
    passed, seen = verdict("nonfinite_ranks", flags_gathered_async_and_waited)
    assert passed, seen


def test_differing_tensors_in_other_styles_pass(verdict):
    for right in (sha256_digests, int_views_reduced):
        passed, seen = verdict("differing_tensors", right)
        assert passed, seen


# ---- nonfinite_ranks --------------------------------------------------------------

def all_reduces_the_loss(loss):
    total = loss.detach().clone()
    dist.all_reduce(total)
    bad = not torch.isfinite(total)
    return list(range(dist.get_world_size())) if bad else []


def only_itself(loss):
    return [dist.get_rank()] if not torch.isfinite(loss) else []


def nan_but_not_inf(loss):
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([float(bool(loss != loss))]))
    return [rank for rank, flag in enumerate(flags) if flag.item()]


def reduces_the_loss_in_place(loss):
    """Right ranks from a gather, but the loss itself all-reduced on the way."""
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([float(not torch.isfinite(loss))]))
    with torch.no_grad():
        dist.all_reduce(loss, op=dist.ReduceOp.MAX)
    return [rank for rank, flag in enumerate(flags) if flag.item()]


# second attempt: mistakes of our own, not in the list above

def one_flag_for_everyone(loss):
    flag = torch.tensor(float(not torch.isfinite(loss)))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return list(range(dist.get_world_size())) if flag else []


def compares_with_plus_inf_only(loss):
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    bad = bool(loss.isnan()) or bool(loss == float("inf"))
    dist.all_gather(flags, torch.tensor([float(bad)]))
    return [rank for rank, flag in enumerate(flags) if flag.item()]


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("differing_tensors", compares_sums, "two rows swapped"),
    ("differing_tensors", compares_with_allclose, "not with allclose"),
    ("differing_tensors", parameters_only, "buffers drift too"),
    ("differing_tensors", against_rank_0_only_on_rank_0, "the ranks returned different lists"),
    ("differing_tensors", nan_is_never_equal, "NaN == NaN is False"),
    ("differing_tensors", compares_norms, "a norm"),
    ("differing_tensors", max_minus_min_with_all_reduce, "NaN == NaN is False"),
    ("differing_tensors", compares_hashes_of_bytes,
     ("hashed bytes with hash()", "PYTHONHASHSEED", "torchrun", "hashlib.sha256")),
    ("differing_tensors", nan_to_num_then_equal, "a NaN on ONE rank"),
    ("nonfinite_ranks", flags_gathered_async_never_waited, ("never waited for",
                                                            "work.wait()")),
    ("nonfinite_ranks", all_reduces_the_loss, "the NaN went through a collective"),
    ("nonfinite_ranks", only_itself, "the ranks answered differently"),
    ("nonfinite_ranks", nan_but_not_inf, "an inf is not a NaN"),
    ("nonfinite_ranks", reduces_the_loss_in_place, "changed the loss it was given"),
    ("nonfinite_ranks", one_flag_for_everyone, "says whether SOME rank is bad"),
    ("nonfinite_ranks", compares_with_plus_inf_only, "-inf counts too"),
]
