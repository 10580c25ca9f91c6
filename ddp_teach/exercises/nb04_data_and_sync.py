"""Checkers for notebook 04's exercises: data across ranks.

The sampler's split is checked against torch's own DistributedSampler, here
in the kernel; the synced batch statistics and the accumulation with
`no_sync` run on real workers. As elsewhere, a wrong answer is compared
with what each typical mistake would produce (blocks instead of a
round-robin deal, no padding or padding only once when the padding is
longer than the dataset, the epoch ignored; local or unweighted
statistics, the unbiased variance; every micro-batch all-reduced, none, or
the loss not divided) so that the hint names it.
"""
import torch
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from ddp_teach.exercises.harness import attempt, run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

SAMPLER_CASES = [(10, 3, shuffle, epoch, drop_last)
                 for shuffle in (False, True) for epoch in (0, 1)
                 for drop_last in (False, True)] + [(12, 4, True, 2, False),
                                                    (7, 2, True, 0, True),
                                                    (1, 4, False, 0, False),
                                                    (2, 7, True, 1, False)]
MICRO_BATCHES = 3


def _torch_indices(length, replicas, rank, shuffle, seed, epoch, drop_last):
    sampler = TorchSampler(range(length), num_replicas=replicas, rank=rank,
                           shuffle=shuffle, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_sampler_split(fn) -> Verdict:
    for length, replicas, shuffle, epoch, drop_last in SAMPLER_CASES:
        for rank in range(replicas):
            args = (length, replicas, rank, shuffle, 0, epoch, drop_last)
            try:
                got = list(fn(*args))
            except NotImplementedError:
                return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
            want = _torch_indices(*args)
            if got == want:
                continue
            shown = (f"length {length}, {replicas} ranks, rank {rank}, "
                     f"shuffle={shuffle}, epoch {epoch}, drop_last={drop_last}: "
                     f"expected {want}, got {got}.\nHint: ")
            return Verdict(WRONG, shown + _sampler_hint(got, want, args))
    return Verdict(CORRECT, "equal to torch's DistributedSampler with and "
                            "without shuffle and drop_last, over several epochs, "
                            "with datasets smaller than the number of ranks too.")


def _sampler_hint(got, want, args) -> str:
    length, replicas, rank, shuffle, seed, epoch, drop_last = args
    if epoch and got == _torch_indices(length, replicas, rank, shuffle, seed,
                                       0, drop_last):
        return ("the order ignores the epoch: seed the generator with "
                "seed + epoch, or every epoch repeats the same order.")
    padding = len(want) * replicas - length
    if len(got) != len(want) and not drop_last and padding > length:
        return (f"here the padding ({padding} indices) is longer than the "
                f"dataset ({length}): repeat the indices as many times as it "
                "takes to reach num_samples * num_replicas, not just once.")
    if len(got) != len(want):
        return ("every rank must get the same number of samples (or ranks "
                "take different numbers of steps and DDP hangs): without "
                "drop_last pad by repeating indices from the start; with it, "
                "drop the tail.")
    if sorted(got) == sorted(want):
        return ("the right samples in the wrong order: shuffle with "
                "torch.randperm(length, generator=g) seeded seed + epoch.")
    return ("deal the (shuffled, padded) indices out round-robin: rank r "
            "takes indices[r::num_replicas], not a contiguous block.")


def _local_batch(rank):
    """Rank r has 2 + r rows of 3 channels: uneven, and different per rank."""
    g = torch.Generator().manual_seed(rank)
    return torch.randn(2 + rank, 3, generator=g) * (rank + 1) + rank


def mean_and_var(global_batch_stats):
    """`ddp_teach.syncbn.global_batch_stats` returns (mean, var, count); the
    exercise returns (mean, var)."""
    def global_stats(x):
        mean, var, _count = global_batch_stats(x)
        return mean, var
    return global_stats


def _stats_on_ranks(rank, world_size, fn):
    stats = attempt(fn, _local_batch(rank))
    if stats is NOT_ATTEMPTED:
        return NOT_ATTEMPTED
    mean, var = stats
    return torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(
        var, dtype=torch.float32)


def check_syncbn_stats(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_stats_on_ranks, world_size, fn)
        if problem:
            return problem
        batches = [_local_batch(r) for r in range(world_size)]
        full = torch.cat(batches)
        want_mean, want_var = full.mean(0), full.var(0, unbiased=False)
        for rank, (mean, var) in enumerate(results):
            if torch.allclose(mean, want_mean, atol=1e-5) and torch.allclose(
                    var, want_var, atol=1e-5):
                continue
            local = batches[rank]
            shown = (f"on {world_size} ranks, rank {rank} (batches of "
                     f"{[len(b) for b in batches]} rows): expected mean "
                     f"{want_mean.tolist()}, var {want_var.tolist()}; got mean "
                     f"{mean.tolist()}, var {var.tolist()}.\nHint: ")
            if torch.allclose(mean, local.mean(0), atol=1e-5):
                return Verdict(WRONG, shown + "these are this rank's own "
                               "statistics: all-reduce the count, the sum and "
                               "the sum of squares first.")
            if torch.allclose(mean, torch.stack([b.mean(0) for b in batches]).mean(0),
                              atol=1e-5):
                return Verdict(WRONG, shown + "you averaged the ranks' means, "
                               "but the ranks hold different numbers of rows: "
                               "all-reduce the sums and the count, then divide.")
            if torch.allclose(var, full.var(0, unbiased=True), atol=1e-5):
                return Verdict(WRONG, shown + "batch norm normalises with the "
                               "biased variance: divide by the count N, not N - 1.")
            return Verdict(WRONG, shown + "var = E[x²] − E[x]² over the global "
                           "batch: all-reduce the sum of squares too.")
    return Verdict(CORRECT, "global mean and variance on 2 and 3 ranks with "
                            "uneven batches.")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1))


def _micro_batches(rank):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(2, 4, generator=g) for _ in range(MICRO_BATCHES)]


def _accumulate_on_ranks(rank, world_size, fn):
    model = torch.nn.parallel.DistributedDataParallel(_model())
    if attempt(fn, model, _micro_batches(rank)) is NOT_ATTEMPTED:
        return NOT_ATTEMPTED
    return [p.grad.clone() if p.grad is not None else None
            for p in model.parameters()]


def _expected_grads(world_size):
    total = None
    for rank in range(world_size):
        model = _model()
        for x in _micro_batches(rank):
            (model(x).square().mean() / MICRO_BATCHES).backward()
        grads = [p.grad for p in model.parameters()]
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    return [t / world_size for t in total]


def check_no_sync(fn) -> Verdict:
    result, problem = run_learner_code(_accumulate_on_ranks, 2, fn,
                                       timeout=15.0, trace=True)
    if problem:
        return problem
    reduces = [e.name for e in result.timeline.for_rank(0).events
               if e.name.startswith("ddp bucket")]
    syncs = len(reduces) // max(1, len(set(reduces)))
    want, got = _expected_grads(2), result[0]
    if syncs == 0:
        return Verdict(WRONG, "the gradients were never all-reduced.\nHint: "
                       "run the LAST micro-batch outside no_sync(): its "
                       "backward reduces everything accumulated so far.")
    if syncs > 1:
        return Verdict(WRONG, f"the gradients were all-reduced {syncs} times "
                       f"for {MICRO_BATCHES} micro-batches.\nHint: wrap every "
                       "micro-batch but the last in `with model.no_sync():`.")
    if all(g is not None and torch.allclose(g, w * MICRO_BATCHES, atol=1e-6)
           for g, w in zip(got, want)):
        return Verdict(WRONG, "the gradients are the SUM over micro-batches.\n"
                       "Hint: divide each micro-batch's loss by the number of "
                       "micro-batches, so the accumulated gradient is a mean.")
    if not all(g is not None and torch.allclose(g, w, atol=1e-6)
               for g, w in zip(got, want)):
        return Verdict(WRONG, "one all-reduce, but the gradients differ from "
                       "the full batch's.\nHint: loss = model(x).square()"
                       ".mean() / len(micro_batches) for each micro-batch.")
    return Verdict(CORRECT, f"{MICRO_BATCHES} micro-batches, one all-reduce, "
                            "the full-batch gradient.")


register(Exercise(
    "sampler_split", "The sampler's index split", "my_rank_indices",
    "ddp_teach.sampler:rank_indices", check_sampler_split,
    ["Shuffle (or not) all indices with a generator seeded seed + epoch.",
     "Pad (or, with drop_last, cut) to a multiple of num_replicas, then "
     "rank r takes indices[r::num_replicas]."],
    stub_parameters=("length", "num_replicas", "rank", "shuffle", "seed", "epoch",
                     "drop_last")))
register(Exercise(
    "syncbn_stats", "SyncBatchNorm's statistics", "my_global_stats",
    "ddp_teach.syncbn:global_batch_stats", check_syncbn_stats,
    ["All-reduce one tensor holding [count, sum per channel, sum of squares "
     "per channel].",
     "mean = sum / count; var = sum_sq / count − mean²."],
    adapt=mean_and_var))
register(Exercise(
    "no_sync_accumulation", "Gradient accumulation with no_sync",
    "my_accumulate", "ddp_teach.ddp:accumulate", check_no_sync,
    ["Loop over the micro-batches; divide each loss by their number.",
     "Every backward but the last goes inside `with model.no_sync():`."]))
