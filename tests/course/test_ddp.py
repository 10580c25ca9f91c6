"""Tests for ddp_teach.ddp: the course's own DistributedDataParallel.

The heavy checks run on real worker processes (gloo), several cases per
`dt.run` so the file stays fast: each worker function returns what it saw
and the assertions are made here, in the test process, where a failure
message can show both sides.
"""
import copy

import pytest
import torch
from torch import nn

import ddp_teach as dt
from ddp_teach.ddp import MIB, DistributedDataParallel, bucket_indices

RTOL, ATOL = 1e-5, 1e-6
STEPS, LR, PER_RANK = 5, 0.1, 4
IN, OUT, WIDE = 8, 4, 512
# None: one bucket; 0: one per parameter; tiny: ~1 KB each; 25.0: the
# default (a 1 MiB first bucket, then the rest).
CAPS = {"none": None, "zero": 0, "tiny": 0.001, "default": 25.0}
RUN_TIMEOUT = 60.0  # a hang fails the test (WorkerTimeout) instead of stalling


class Net(nn.Module):
    """A frozen weight, a frozen bias, a tied weight, a buffer used in
    forward, and a 512 x 512 layer (exactly 1 MiB of weight) so the default
    cap gives a 1 MiB first bucket plus a second one."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.weight.requires_grad_(False)  # frozen weight
        self.hidden = nn.Linear(16, 16)
        self.hidden.bias.requires_grad_(False)    # frozen bias
        self.tied = nn.Linear(16, 16)
        self.tied.weight = self.hidden.weight     # tied: one parameter, used twice
        self.up = nn.Linear(16, WIDE)
        self.big = nn.Linear(WIDE, WIDE)
        self.out = nn.Linear(WIDE, OUT)
        self.register_buffer("scale", torch.rand(16) + 0.5)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.frozen(h)) * self.scale
        h = torch.tanh(self.hidden(h))
        h = torch.tanh(self.tied(h))
        h = torch.tanh(self.up(h))
        h = torch.tanh(self.big(h))
        return self.out(h)


def make_net(seed):
    torch.manual_seed(seed)
    return Net()


def batch(step, rank, n=PER_RANK):
    """Rank `rank`'s batch at `step`: different on every rank, reproducible
    everywhere (so any process can build the full batch)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, IN, generator=g), torch.randn(n, OUT, generator=g)


def full_batch(step, world_size):
    xs, ys = zip(*(batch(step, r) for r in range(world_size)))
    return torch.cat(xs), torch.cat(ys)


def state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def train(model, step_batch, set_to_none=True):
    """STEPS of plain SGD; `model` is a DDP wrapper or a bare module."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = step_batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return model


def unwrap_state(model):
    return state(model.module if hasattr(model, "module") else model)


# ---- bucket_indices: pure function ------------------------------------------

def test_bucket_indices_none_is_one_bucket_in_reverse_order():
    assert bucket_indices([4, 8, 12], None) == [[2, 1, 0]]
    assert bucket_indices([], None) == []


def test_bucket_indices_zero_is_one_bucket_per_parameter_last_first():
    assert bucket_indices([4, 8, 12, 16], 0) == [[3], [2], [1], [0]]
    assert bucket_indices([], 0) == []


def test_bucket_indices_first_bucket_is_capped_at_one_mib():
    quarter = MIB // 4
    buckets = bucket_indices([quarter] * 10, 25 * MIB)
    assert buckets == [[9, 8, 7, 6], [5, 4, 3, 2, 1, 0]]
    # an explicit first cap is honoured too
    assert bucket_indices([quarter] * 4, 25 * MIB, first_cap_bytes=quarter) == [
        [3], [2, 1, 0]]


def test_bucket_indices_reverse_order_and_caps_after_the_first():
    sizes = [3 * MIB, 2 * MIB, 2 * MIB, 5 * MIB, 1 * MIB, MIB // 2]
    buckets = bucket_indices(sizes, 4 * MIB)
    flat = [i for b in buckets for i in b]
    assert flat == list(reversed(range(len(sizes))))  # every index once, last first
    assert buckets == [[5, 4], [3], [2, 1], [0]]
    # a bucket closes once it holds at least its cap; only the last may be short
    for b in buckets[1:-1]:
        assert sum(sizes[i] for i in b) >= 4 * MIB
    assert sum(sizes[i] for i in buckets[0]) >= MIB


def test_bucket_indices_cap_below_one_mib_caps_the_first_bucket_too():
    assert bucket_indices([100] * 6, 250) == [[5, 4, 3], [2, 1, 0]]


def torch_rebuilt_buckets(sizes, cap, first_cap):
    """What torch's reducer computes when it rebuilds its buckets, for
    gradients that became ready from the last parameter to the first."""
    import torch.distributed as dist
    order = list(reversed(range(len(sizes))))
    tensors = [torch.empty(sizes[i], dtype=torch.uint8) for i in order]
    result = dist._compute_bucket_assignment_by_size(tensors, [first_cap, cap], [], order)
    return result[0] if isinstance(result, tuple) else result  # (indices, limits) since 2.x


@pytest.mark.skipif(not hasattr(torch.distributed, "_compute_bucket_assignment_by_size"),
                    reason="this torch has no _compute_bucket_assignment_by_size to compare with")
def test_bucket_indices_is_torchs_rebuild_rule_for_first_caps_up_to_the_cap():
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(1, 9, (), generator=generator))
        sizes = torch.randint(1, 21, (n,), generator=generator).tolist()
        cap = int(torch.randint(0, 41, (), generator=generator))
        first = int(torch.randint(0, cap + 1, (), generator=generator))
        assert bucket_indices(sizes, cap, first) == torch_rebuilt_buckets(
            sizes, cap, first), (sizes, cap, first)


def buckets_seen_worker(rank, world_size):
    """The parameter indices of each bucket a comm hook is handed, per step,
    under torch's DDP and ours, for the same caps."""
    import torch.distributed as dist

    def record(net, model, steps=3):
        index = {p: i for i, p in enumerate(model.parameters())}
        seen = []

        def hook(state, bucket):
            seen[-1].append([index[p] for p in bucket.parameters()])
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda f: f.value()[0].div_(world_size))
        net.register_comm_hook(None, hook)
        for _ in range(steps):
            seen.append([])
            net(torch.ones(2, WIDE)).sum().backward()
        return seen

    out = {}
    for name, torch_kwargs, ours_kwargs in (
            ("unset", {}, {}),
            ("25", {"bucket_cap_mb": 25}, {"bucket_cap_mb": 25, "first_bucket_cap_mb": 25}),
            ("2", {"bucket_cap_mb": 2}, {"bucket_cap_mb": 2, "first_bucket_cap_mb": 2}),
            ("0.5", {"bucket_cap_mb": 0.5}, {"bucket_cap_mb": 0.5, "first_bucket_cap_mb": 0.5})):
        model = nn.Sequential(*[nn.Linear(WIDE, WIDE) for _ in range(3)])
        out[name] = {"torch": record(nn.parallel.DistributedDataParallel(model, **torch_kwargs), model)}
        model = nn.Sequential(*[nn.Linear(WIDE, WIDE) for _ in range(3)])
        out[name]["ours"] = record(DistributedDataParallel(model, **ours_kwargs), model)
    return out


def test_our_buckets_are_torchs_from_its_second_step_and_its_first_has_one():
    """torch 2.13 runs its first step with one bucket, then rebuilds: the
    first bucket capped at 1 MiB only when bucket_cap_mb is unset. Ours,
    given the same first cap, are the same buckets from the start."""
    seen = dt.run(buckets_seen_worker, 2, timeout=RUN_TIMEOUT)[0]
    everything = list(range(6))
    expected = {"unset": [[5, 4], [3, 2, 1, 0]], "25": [everything[::-1]],
                "2": [[5, 4, 3, 2], [1, 0]], "0.5": [[5, 4], [3, 2], [1, 0]]}
    for name, buckets in expected.items():
        assert seen[name]["torch"][0] == [everything], name  # one bucket, first step
        assert seen[name]["torch"][1:] == [buckets] * 2, name
        assert seen[name]["ours"] == [buckets] * 3, name


# ---- equivalence with a full-batch baseline and torch's DDP -------------------

def equivalence_worker(rank, world_size):
    out = {"caps": {}, "buckets": {}}
    base = train(make_net(0), lambda s: full_batch(s, world_size))  # rank 0's init
    out["baseline"] = state(base)
    local = lambda s: batch(s, rank)

    for i, (name, cap) in enumerate(CAPS.items()):
        model = make_net(seed=rank)  # different on every rank before wrapping
        before = state(model)
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        if name == "none":
            out["before"], out["after_wrap"] = before, state(model)
        names = {p: n for n, p in model.named_parameters()}
        out["buckets"][name] = [[names[p] for p in b.params] for b in ddp.buckets]
        train(ddp, local, set_to_none=i % 2 == 0)  # both ways of zeroing
        out["caps"][name] = unwrap_state(ddp)

    tddp = torch.nn.parallel.DistributedDataParallel(make_net(seed=rank))
    out["torch"] = unwrap_state(train(tddp, local))

    # no_sync: K micro-batches accumulated locally, one more outside, synced
    k = 2
    out["no_sync"] = {}
    for name in ("none", "zero"):
        ddp = DistributedDataParallel(make_net(seed=rank), bucket_cap_mb=CAPS[name])
        plain = copy.deepcopy(ddp.module)  # rank 0's values, no DDP
        with ddp.no_sync():
            for micro in range(k):
                x, y = batch(10 + micro, rank)
                (nn.functional.mse_loss(ddp(x), y) / (k + 1)).backward()
                x, y = batch(10 + micro, rank)
                (nn.functional.mse_loss(plain(x), y) / (k + 1)).backward()
        inside = {n: p.grad.clone() for n, p in ddp.module.named_parameters()
                  if p.requires_grad}
        local_ref = {n: p.grad.clone() for n, p in plain.named_parameters()
                     if p.requires_grad}
        x, y = batch(10 + k, rank)
        (nn.functional.mse_loss(ddp(x), y) / (k + 1)).backward()
        synced = {n: p.grad.clone() for n, p in ddp.module.named_parameters()
                  if p.requires_grad}
        out["no_sync"][name] = dict(inside=inside, local_ref=local_ref, synced=synced)
    ref = make_net(0)
    xs, ys = zip(*(batch(10 + m, r) for m in range(k + 1) for r in range(world_size)))
    nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
    out["no_sync_full"] = {n: p.grad.clone() for n, p in ref.named_parameters()
                           if p.requires_grad}
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def equivalence(request):
    return request.param, dt.run(equivalence_worker, request.param,
                                 timeout=RUN_TIMEOUT)


def assert_states_close(actual, expected, what):
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"{what}, {key}: {m}")


@pytest.mark.parametrize("cap", list(CAPS))
def test_five_sgd_steps_match_full_batch_baseline(equivalence, cap):
    world_size, results = equivalence
    for rank, out in enumerate(results):
        assert_states_close(out["caps"][cap], out["baseline"],
                            f"world {world_size} rank {rank} cap {cap} vs baseline")


@pytest.mark.parametrize("cap", list(CAPS))
def test_five_sgd_steps_match_torch_ddp(equivalence, cap):
    world_size, results = equivalence
    for rank, out in enumerate(results):
        assert_states_close(out["caps"][cap], out["torch"],
                            f"world {world_size} rank {rank} cap {cap} vs torch DDP")


def test_training_actually_moved_the_parameters(equivalence):
    """Guards the comparisons above against a vacuous pass."""
    _, results = equivalence
    out = results[0]
    init = out["after_wrap"]
    assert not torch.allclose(out["caps"]["default"]["big.weight"], init["big.weight"])
    assert torch.equal(out["caps"]["default"]["frozen.weight"], init["frozen.weight"])
    assert torch.equal(out["caps"]["default"]["hidden.bias"], init["hidden.bias"])


@pytest.mark.parametrize("cap", list(CAPS))
def test_all_ranks_hold_identical_parameters(equivalence, cap):
    _, results = equivalence
    for rank, out in enumerate(results[1:], start=1):
        for key, value in out["caps"][cap].items():
            assert torch.equal(value, results[0]["caps"][cap][key]), (rank, key)


def test_bucket_layouts_for_each_cap(equivalence):
    _, results = equivalence
    buckets = results[0]["buckets"]
    trainable = ["inp.weight", "inp.bias", "frozen.bias", "hidden.weight",
                 "tied.bias", "up.weight", "up.bias", "big.weight", "big.bias",
                 "out.weight", "out.bias"]  # frozen ones absent, tied one once
    assert buckets["none"] == [trainable[::-1]]
    assert buckets["zero"] == [[n] for n in trainable[::-1]]
    assert buckets["default"] == [
        ["out.bias", "out.weight", "big.bias", "big.weight"],  # >= 1 MiB: closes
        ["up.bias", "up.weight", "tied.bias", "hidden.weight", "frozen.bias",
         "inp.bias", "inp.weight"]]
    assert [n for b in buckets["tiny"] for n in b] == trainable[::-1]
    assert 1 < len(buckets["tiny"]) < len(trainable)


def test_construction_broadcasts_rank0_params_frozen_and_buffers(equivalence):
    world_size, results = equivalence
    rank0_before = results[0]["before"]
    for rank, out in enumerate(results):
        if rank:  # the seeds differ, so before wrapping the ranks differ...
            for key in ("inp.weight", "frozen.weight", "hidden.bias", "scale"):
                assert not torch.equal(out["before"][key], rank0_before[key]), key
        for key, value in out["after_wrap"].items():  # ...and after, they agree
            assert torch.equal(value, rank0_before[key]), (rank, key)


@pytest.mark.parametrize("cap", ["none", "zero"])
def test_no_sync_accumulates_locally_then_syncs_the_sum(equivalence, cap):
    world_size, results = equivalence
    for rank, out in enumerate(results):
        case = out["no_sync"][cap]
        for name, grad in case["inside"].items():  # local: nothing was reduced
            torch.testing.assert_close(grad, case["local_ref"][name], rtol=RTOL,
                                       atol=ATOL)
        for name, grad in case["synced"].items():  # K inside + 1 outside = full
            torch.testing.assert_close(grad, out["no_sync_full"][name], rtol=RTOL,
                                       atol=ATOL, msg=lambda m: f"{rank} {name}: {m}")
    # the local gradients really did differ between ranks (non-vacuous)
    a, b = (r["no_sync"][cap]["inside"]["big.weight"] for r in results[:2])
    assert not torch.allclose(a, b)


# ---- the wrapper's own behaviour ---------------------------------------------

class Branchy(nn.Module):
    """`side` is used only when asked: an unused parameter for an iteration."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.side = nn.Linear(6, 6)
        self.last = nn.Linear(6, 3)

    def forward(self, x, use_side=True):
        h = torch.tanh(self.first(x))
        if use_side:
            h = h + torch.tanh(self.side(h))
        return self.last(h)


def behaviour_worker(rank, world_size):
    out = {}
    torch.manual_seed(rank)
    inner = Branchy()
    ddp = DistributedDataParallel(inner, bucket_cap_mb=0)  # side mid-order
    out["same_params"] = list(ddp.parameters()) == list(inner.parameters()) and all(
        a is b for a, b in zip(ddp.parameters(), inner.parameters()))
    out["n_params"] = (len(list(ddp.parameters())), len(list(inner.parameters())))
    out["names"] = ([n for n, _ in ddp.named_parameters()],
                    [n for n, _ in inner.named_parameters()])
    out["n_buffers"] = len(list(ddp.buffers()))

    # unused parameters: on every rank, then on rank 0 only, then used again
    plain = copy.deepcopy(inner)
    usage = [lambda r: False, lambda r: r != 0, lambda r: True]
    out["unused"] = []
    for it, uses in enumerate(usage):
        g = torch.Generator().manual_seed(100 * it + rank)
        x = torch.randn(5, 6, generator=g)
        ddp.zero_grad()
        ddp(x, use_side=uses(rank)).square().mean().backward()
        plain.zero_grad()
        plain(x, use_side=uses(rank)).square().mean().backward()
        out["unused"].append(dict(
            used=uses(rank),
            synced={n: p.grad.clone() for n, p in inner.named_parameters()},
            local={n: (torch.zeros_like(p) if p.grad is None else p.grad.clone())
                   for n, p in plain.named_parameters()}))

    # gradients are views into the bucket buffers, also after a step and a
    # set_to_none zero_grad
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    out["views"] = []
    for it in range(2):
        ddp(torch.randn(5, 6)).square().mean().backward()
        for bucket in ddp.buckets:
            start = bucket.buffer.data_ptr()
            end = start + bucket.buffer.numel() * bucket.buffer.element_size()
            for p in bucket.params:
                out["views"].append(
                    p.grad.untyped_storage().data_ptr()
                    == bucket.buffer.untyped_storage().data_ptr()
                    and start <= p.grad.data_ptr() < end)
            flat = torch.cat([p.grad.reshape(-1) for p in bucket.params])
            out["views"].append(torch.equal(flat, bucket.buffer))
        opt.step()
        opt.zero_grad(set_to_none=True)

    # finish_gradient_synchronization: idempotent, harmless without backward
    fresh = DistributedDataParallel(Branchy(), bucket_cap_mb=None)
    if rank == 0:
        fresh.finish_gradient_synchronization()  # one rank only: must not reduce
    twin = copy.deepcopy(fresh.module)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(rank))
    fresh.zero_grad()
    fresh(x).square().mean().backward()
    twin(x).square().mean().backward()
    out["finish_local"] = [p.grad.clone() for p in twin.parameters()]
    after = [p.grad.clone() for p in fresh.parameters()]
    fresh.finish_gradient_synchronization()
    fresh.finish_gradient_synchronization()
    out["finish_after"], out["finish_again"] = after, [
        p.grad.clone() for p in fresh.parameters()]
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def behaviour(request):
    return request.param, dt.run(behaviour_worker, request.param,
                                 timeout=RUN_TIMEOUT)


def test_parameters_order_and_count_unchanged(behaviour):
    _, results = behaviour
    for out in results:
        assert out["same_params"]
        assert out["n_params"] == (6, 6)
        ddp_names, names = out["names"]
        assert ddp_names == ["module." + n for n in names]
        assert out["n_buffers"] == 0  # the bucket buffers are not module buffers


def test_unused_parameter_does_not_hang_and_gets_the_others_average(behaviour):
    world_size, results = behaviour
    for it in range(3):
        for name in results[0]["unused"][it]["synced"]:
            expected = sum(r["unused"][it]["local"][name] for r in results) / world_size
            for rank, out in enumerate(results):
                torch.testing.assert_close(
                    out["unused"][it]["synced"][name], expected, rtol=RTOL, atol=ATOL,
                    msg=lambda m: f"iteration {it} rank {rank} {name}: {m}")
    # iteration 0: nobody used `side`, its gradient is exactly zero
    assert all(not torch.any(r["unused"][0]["synced"]["side.weight"]) for r in results)
    # iteration 1: rank 0 did not use it, the others did, and it is not zero
    assert not results[0]["unused"][1]["used"] and results[1]["unused"][1]["used"]
    assert torch.any(results[0]["unused"][1]["synced"]["side.weight"])


def test_gradients_are_views_into_the_bucket_buffers(behaviour):
    _, results = behaviour
    for out in results:
        assert out["views"] and all(out["views"])


def test_finish_gradient_synchronization_is_idempotent(behaviour):
    world_size, results = behaviour
    for out in results:
        for a, b in zip(out["finish_after"], out["finish_again"]):
            assert torch.equal(a, b)
    # and what backward left is the average (so a second division would show)
    for i, grad in enumerate(results[0]["finish_after"]):
        expected = sum(r["finish_local"][i] for r in results) / world_size
        torch.testing.assert_close(grad, expected, rtol=RTOL, atol=ATOL)


# ---- bucket order, traced ----------------------------------------------------

class OutOfOrder(nn.Module):
    """Registered a, b, c but run b -> a -> c, so gradients become ready in
    the order c, a, b while the buckets (reverse registration) are c, b, a:
    launching as soon as ready would break bucket order."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)

    def forward(self, x, use_b=True):
        if use_b:
            x = torch.tanh(self.b(x))
        return self.c(torch.tanh(self.a(x)))


def traced_worker(rank, world_size, iterations=3):
    model = dt.trace_layers(OutOfOrder())
    ddp = DistributedDataParallel(model, bucket_cap_mb=0)
    for it in range(iterations):
        ddp.zero_grad()
        use_b = not (it == iterations - 1 and rank == 1)  # last: rank 1 skips b
        with dt.span(f"iteration {it}"):
            ddp(torch.randn(4, 8), use_b=use_b).square().sum().backward()
    return len(ddp.buckets)


@pytest.mark.parametrize("world_size", [2, 3])
def test_buckets_are_launched_in_bucket_order_on_every_rank(world_size):
    iterations = 3
    result = dt.run(traced_worker, world_size, kwargs={"iterations": iterations},
                    trace=True, timeout=RUN_TIMEOUT)
    n_buckets = result[0]
    assert n_buckets == 6
    for rank in range(world_size):
        events = result.timeline.for_rank(rank).events
        names = [e.name for e in events
                 if e.kind == "comm" and e.name.startswith("bucket ")]
        assert names == [f"bucket {i}" for i in range(n_buckets)] * iterations, rank
        # overlap: bucket 0 (layer c) goes out while backward of a and b runs
        first_iteration = [e for e in events if e.start < next(
            f.end for f in events if f.name == "iteration 0")]
        bucket0 = next(e for e in first_iteration if e.name == "bucket 0")
        backward_b = next(e for e in first_iteration if e.name == "backward b")
        assert bucket0.start < backward_b.end


# ---- known divergence from single-process training and torch's DDP -----------

def globally_unused_worker(rank, world_size):
    """`side` is used at step 0 and by nobody at step 1; momentum SGD."""
    out = {}
    for name in ("ours", "single"):
        torch.manual_seed(0)
        model = Branchy()
        wrapped = (DistributedDataParallel(model, find_unused_parameters=True)
                   if name == "ours" else model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step, use_side in enumerate([True, False]):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            wrapped(x, use_side=use_side).square().mean().backward()
            if step == 1:
                out[name + "_grad_is_none"] = model.side.weight.grad is None
            opt.step()
            opt.zero_grad()
        out[name] = model.side.weight.detach().clone()
    return out


def test_parameter_unused_on_every_rank_keeps_grad_none_like_torch():
    """With find_unused_parameters=True, as in torch; by default it would keep
    a zero gradient (documented in ddp.py)."""
    out = dt.run(globally_unused_worker, 2, timeout=RUN_TIMEOUT)[0]
    assert out["single_grad_is_none"]  # the reference behaviour
    assert out["ours_grad_is_none"]
    torch.testing.assert_close(out["ours"], out["single"], rtol=RTOL, atol=ATOL)


def test_wrapping_a_module_again_replaces_the_old_wrappers_hooks():
    """Re-running a notebook cell wraps the same module twice: each bucket
    must still be all-reduced once per backward, not once per wrapper."""
    def wrap_twice(rank, world_size):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        DistributedDataParallel(model)
        ddp = DistributedDataParallel(model)
        ddp(torch.ones(2, 4)).sum().backward()
        return model.weight.grad.clone()

    result = dt.run(wrap_twice, 2, trace=True, timeout=RUN_TIMEOUT)
    reduces = [e for e in result.timeline.for_rank(0).events
               if e.name.startswith("bucket")]
    assert len(reduces) == 1
    torch.testing.assert_close(result[0], result[1])


def refusals_worker(rank, world_size):
    """What each bad construction raised on this rank: (type, message), or
    "accepted"."""
    frozen = nn.Linear(2, 2).requires_grad_(False)
    cases = {"no parameters": lambda: DistributedDataParallel(nn.ReLU()),
             "all frozen": lambda: DistributedDataParallel(frozen),
             "negative cap": lambda: DistributedDataParallel(
                 nn.Linear(2, 2), bucket_cap_mb=-1),
             "cap not a number": lambda: DistributedDataParallel(
                 nn.Linear(2, 2), bucket_cap_mb="25"),
             "first cap None": lambda: DistributedDataParallel(
                 nn.Linear(2, 2), first_bucket_cap_mb=None)}
    refused = {}
    for case, construct in cases.items():
        try:
            construct()
        except (RuntimeError, ValueError) as error:
            refused[case] = (type(error).__name__, str(error))
        else:
            refused[case] = "accepted"
    return refused


def test_bad_modules_and_caps_are_refused_on_every_rank_with_what_to_do():
    """torch's DDP refuses a module with nothing to train (a RuntimeError);
    a negative or non-numeric cap is a ValueError that says what the cap is."""
    for refused in dt.run(refusals_worker, 2, timeout=RUN_TIMEOUT):
        for case in ("no parameters", "all frozen"):
            kind, message = refused[case]
            assert kind == "RuntimeError", refused[case]
            assert "requires a gradient" in message and "without DDP" in message
        assert "ReLU has 0 parameters." in refused["no parameters"][1]
        assert "Linear has 2 parameters, all frozen" in refused["all frozen"][1]
        for case, shown in (("negative cap", "-1"), ("cap not a number", "'25'")):
            kind, message = refused[case]
            assert kind == "ValueError", refused[case]
            assert f"bucket_cap_mb must be a number >= 0 or None, got {shown}" in message
            assert "in MiB (torch's default is 25" in message
        kind, message = refused["first cap None"]
        assert kind == "ValueError" and (
            "first_bucket_cap_mb must be a number >= 0, got None" in message), message
