"""`ddp_teach.collectives`: every hand-written collective against gloo's own
on real ranks, for world sizes 1-4 and 7, lengths from 0 to 1003 (shorter
than the world size, not divisible by it), float32 / float64 / int64, a 0-d
and a non-contiguous input; and, from traced runs, the messages each
algorithm sends, which its docstring promises."""
import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach import collectives

WORLD_SIZES = (1, 2, 3, 4, 7)
DTYPES = (torch.float32, torch.float64, torch.int64)
NOT_DIVISIBLE = 1003  # by any of 2, 3, 4, 7
ALLREDUCES = ("ring_allreduce", "naive_allreduce", "tree_allreduce")


def lengths(world_size: int) -> list[int]:
    return [0, 1, 3, world_size - 1, 1000, NOT_DIVISIBLE]


def random_tensor(rank: int, shape, dtype) -> torch.Tensor:
    """Different on every rank, the same on every run; ints include negatives."""
    generator = torch.Generator().manual_seed(1009 * rank + sum(shape))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    return torch.randint(-1000, 1000, shape, generator=generator, dtype=dtype)


def inputs(rank: int, world_size: int) -> list[torch.Tensor]:
    """Every case, as this rank's tensor: each length in each dtype, a 0-d
    tensor, and transposed (non-contiguous) float and int matrices."""
    cases = [random_tensor(rank, (n,), dtype)
             for n in lengths(world_size) for dtype in DTYPES]
    cases.append(torch.tensor(rank + 0.5))
    cases += [random_tensor(rank, (5, 7), dtype).t() for dtype in DTYPES]
    assert not cases[-1].is_contiguous()
    return cases


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact for integers; allclose for floats (the order of the additions
    differs from gloo's)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype.is_floating_point:
        assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-6), \
            (actual - expected).abs().max()
    else:
        assert torch.equal(actual, expected)


def allreduce_cases(rank, world_size, name):
    """Per case: (ours, returned-the-input?, stayed non-contiguous?, gloo's)."""
    results = []
    for tensor in inputs(rank, world_size):
        expected = tensor.contiguous().clone()
        dist.all_reduce(expected)
        ours = tensor.clone()  # keeps a transposed input's strides
        returned = getattr(collectives, name)(ours)
        results.append((ours, returned is ours,
                        ours.is_contiguous() == tensor.is_contiguous(), expected))
    return results


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", ALLREDUCES)
def test_allreduce_matches_gloo_in_place(name, world_size):
    per_rank = dt.run(allreduce_cases, world_size, args=(name,))
    for results in per_rank:
        for ours, returned_input, same_layout, expected in results:
            assert returned_input and same_layout
            assert_matches(ours, expected)
    for case, (rank0_result, *_) in enumerate(per_rank[0]):
        for results in per_rank[1:]:  # every rank ends with the same bits
            assert torch.equal(results[case][0], rank0_result)


def reduce_scatter_cases(rank, world_size):
    """Per case: (ours, input unchanged?, chunk of gloo's all_reduce, gloo's
    reduce_scatter or None where the length does not divide)."""
    results = []
    for tensor in inputs(rank, world_size):
        flat = tensor.flatten()
        summed = flat.clone()
        dist.all_reduce(summed)
        scattered = None
        if flat.numel() % world_size == 0:
            scattered = flat.new_empty(flat.numel() // world_size)
            dist.reduce_scatter_single(scattered, flat.clone())
        original = tensor.clone()
        ours = collectives.ring_reduce_scatter(tensor)
        results.append((ours, torch.equal(tensor, original),
                        summed.tensor_split(world_size)[rank], scattered))
    return results


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_reduce_scatter_gives_rank_r_chunk_r(world_size):
    checked_against_reduce_scatter = 0
    for results in dt.run(reduce_scatter_cases, world_size):
        for ours, input_unchanged, chunk_of_sum, scattered in results:
            assert input_unchanged
            assert_matches(ours, chunk_of_sum)
            if scattered is not None:
                assert_matches(ours, scattered)
                checked_against_reduce_scatter += 1
    assert checked_against_reduce_scatter >= 3 * world_size  # 0 always divides


def all_gather_cases(rank, world_size):
    """Per case: (ours, gloo's all_gather)."""
    results = []
    for tensor in inputs(rank, world_size):
        expected = [torch.empty_like(tensor.contiguous()) for _ in range(world_size)]
        dist.all_gather(expected, tensor.contiguous())
        results.append((collectives.ring_all_gather(tensor), expected))
    return results


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_gather_matches_gloo(world_size):
    for results in dt.run(all_gather_cases, world_size):
        for ours, expected in results:
            assert len(ours) == world_size
            for ours_from_rank, expected_from_rank in zip(ours, expected):
                assert torch.equal(ours_from_rank, expected_from_rank)  # copies
                assert ours_from_rank.shape == expected_from_rank.shape


def expected_sends(name: str, rank: int, world_size: int, numel: int):
    """The sizes, in elements and in order, of the messages `rank` sends, as
    the docstrings say. For the ring this pins the schedule: at step s of the
    reduce-scatter rank r sends chunk (r - s) mod p, then at step s of the
    all-gather chunk (r + 1 - s) mod p (its own finished chunk first)."""
    if name == "ring_allreduce":
        chunk = [c.numel() for c in torch.empty(numel).tensor_split(world_size)]
        steps = range(world_size - 1)
        return ([chunk[(rank - s) % world_size] for s in steps]
                + [chunk[(rank + 1 - s) % world_size] for s in steps])
    if name == "naive_allreduce":
        return [numel] * (world_size - 1 if rank == 0 else 1)
    assert world_size == 5  # tree 0 -> 1, 2, 4; 2 -> 3: one send per edge
    return [numel] * [3, 1, 2, 1, 1][rank]


def one_allreduce(rank, world_size, name, numel):
    getattr(collectives, name)(torch.ones(numel))


@pytest.mark.parametrize("name", ALLREDUCES)
def test_messages_sent_are_those_the_docstring_counts(name):
    world_size, numel = 5, NOT_DIVISIBLE  # chunks of 201, 201, 201, 200, 200
    timeline = dt.run(one_allreduce, world_size, args=(name, numel),
                      trace=True).timeline
    assert {e.name for e in timeline} <= {"size check", "send", "isend", "recv",
                                          "irecv"}
    for rank in range(world_size):
        size_checks = [e.nbytes for e in timeline.for_rank(rank)
                       if e.name == "size check"]
        assert size_checks == [16], size_checks  # two int64 counts, once
        sent_bytes = [e.nbytes for e in timeline.for_rank(rank)
                      if e.name in ("send", "isend")]
        expected = expected_sends(name, rank, world_size, numel)
        assert sent_bytes == [4 * n for n in expected], rank


def allreduce_on_new_group(rank, world_size):
    group = dist.new_group(list(range(world_size)))
    try:
        collectives.ring_allreduce(torch.ones(3), group=group)
    except ValueError as error:
        return str(error)
    return "accepted"


def test_ring_allreduce_refuses_other_groups():
    messages = dt.run(allreduce_on_new_group, 2)
    assert all("only the default process group" in m for m in messages), messages


def allreduce_requiring_grad(rank, world_size):
    """Per all-reduce: a parameter's and an activation's values afterwards,
    and whether autograd still sees them as before, next to gloo's."""
    results = {}
    for name in ("gloo",) + ALLREDUCES:
        reduce = dist.all_reduce if name == "gloo" else getattr(collectives, name)
        param = torch.nn.Parameter(torch.arange(4.0) + rank)
        activation = param * 2  # not a leaf: has a grad_fn
        reduce(param)
        reduce(activation)
        results[name] = {"param": param.detach().clone(), "is_leaf": param.is_leaf,
                         "requires_grad": param.requires_grad,
                         "activation": activation.detach().clone(),
                         "grad_fn": type(activation.grad_fn).__name__}
    return results


def test_allreduce_of_a_tensor_requiring_grad_sums_its_data_like_gloo():
    """dist.all_reduce sums a parameter in place outside autograd; ours must
    too, rather than fail on autograd's in-place check."""
    for results in dt.run(allreduce_requiring_grad, 2):
        gloo = results["gloo"]
        torch.testing.assert_close(gloo["param"], torch.arange(4.0) * 2 + 1)
        for name in ALLREDUCES:
            assert results[name]["is_leaf"] and results[name]["requires_grad"], name
            assert results[name]["grad_fn"] == gloo["grad_fn"] == "MulBackward0"
            torch.testing.assert_close(results[name]["param"], gloo["param"])
            torch.testing.assert_close(results[name]["activation"],
                                       gloo["activation"])


def allreduce_of_different_lengths(rank, world_size):
    """Per all-reduce: the error of a length that differs on the last rank,
    then the sum of tensors whose shapes differ but not their lengths."""
    results = {}
    for name in ALLREDUCES:
        try:
            getattr(collectives, name)(torch.ones(6 if rank == world_size - 1 else 4))
            refused = "accepted"
        except ValueError as error:
            refused = str(error)
        same_count = torch.ones((2, 3) if rank == 0 else (3, 2))
        getattr(collectives, name)(same_count)
        results[name] = (refused, same_count)
    return results


def test_allreduce_of_different_lengths_is_refused_on_every_rank():
    """gloo would abort the process (SIGABRT); ours says what differs on
    every rank, even where a rank's neighbours have its length, and, like
    dist.all_reduce, sums tensors of different shapes but equal lengths."""
    world_size = 3
    per_rank = dt.run(allreduce_of_different_lengths, world_size)
    for rank, results in enumerate(per_rank):
        own = 6 if rank == world_size - 1 else 4
        for name in ALLREDUCES:
            refused, same_count = results[name]
            assert refused.startswith(
                f"{name} needs a tensor with the same number of elements on "
                f"every rank"), refused
            assert (f"this rank's has {own} (shape ({own},)), and the ranks' "
                    f"range from 4 to 6") in refused, refused
            assert torch.equal(same_count, torch.full_like(same_count, world_size))


def ring_halves_on_odd_inputs(rank, world_size):
    """The reduce-scatter and all-gather halves: refused on lengths that
    differ; on a tensor that requires grad, results outside autograd, as
    torch's collectives give."""
    refused = {}
    for name in ("ring_reduce_scatter", "ring_all_gather"):
        try:
            getattr(collectives, name)(torch.ones(6 if rank == 0 else 4))
            refused[name] = "accepted"
        except ValueError as error:
            refused[name] = str(error)
    param = torch.nn.Parameter(torch.arange(4.0))
    scattered = collectives.ring_reduce_scatter(param)
    gathered = collectives.ring_all_gather(param)
    return refused, scattered.requires_grad, [g.requires_grad for g in gathered]


def test_the_ring_halves_refuse_different_lengths_and_leave_autograd_out():
    for refused, scattered_grad, gathered_grad in dt.run(ring_halves_on_odd_inputs, 2):
        for name, message in refused.items():
            assert message.startswith(f"{name} needs a tensor with the same "
                                      "number of elements on every rank"), message
        assert scattered_grad is False and gathered_grad == [False, False]
