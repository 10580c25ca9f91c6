"""Checker for notebook 04's SyncBatchNorm exercise, on real ranks (the
sampler's split is checked in nb04_sampler.py, gradient accumulation with
`no_sync` in nb04_accumulation.py).

`syncbn_stats`: the learner's `my_global_stats(x)` runs on every rank with
that rank's rows, traced. What the reference (`syncbn.global_batch_stats`,
adapted to return (mean, var)) guarantees, and how each is checked:

- values: per channel, the mean and the biased variance of the rows of
  every rank together, within float32 rounding of sums over the global
  batch (a float64 reference; the bound grows with the number of rows);
- ranks with different numbers of rows, one rank alone, and a rank with
  no rows at all, which must still take part and get the global values;
- one value per channel (shape (C,));
- the input is left as it was (no in-place squaring or centring);
- the rows stay where they are: one small all-reduce of the count and the
  per-channel sums, so each rank moves a few times 2C + 1 numbers however
  many rows it holds (from the trace's bytes).

Hash seeds cannot change these results (nothing is hashed); the ranks'
data differ by construction.

Wrong answers are compared with the typical mistakes (local or
mean-of-means statistics, the unbiased variance, a NaN from an empty rank,
the input changed, the rows gathered, an async all-reduce never waited)
so that the hint names the one made.
"""
import torch

from ddp_teach.exercises.harness import (UNWAITED_HINT, attempt, lands_on_wait,
                                        never_waited, run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

CHANNELS = 3
# rows on each rank, small to large: one rank alone, then with one row (no
# unbiased variance there: 4 rows first tell that mistake by name); uneven;
# an empty rank beside a big one; five ranks
ROWS_CASES = [(4,), (1,), (2, 3), (2, 3, 4), (50, 0, 3), (1, 2, 3, 4, 5)]
STATS_BYTES_PER_RANK = 3 * (2 * CHANNELS + 1) * 8  # three all-reduces of float64
NEVER_WAITED = "an async all-reduce never waited"  # what a rank reports then


def _local_batch(rank, rows):
    """Rank r's rows: a different mean and spread per rank."""
    g = torch.Generator().manual_seed(rank)
    return torch.randn(rows, CHANNELS, generator=g) * (rank + 1) + rank


def mean_and_var(global_batch_stats):
    """`ddp_teach.syncbn.global_batch_stats` returns (mean, var, count); the
    exercise returns (mean, var)."""
    def global_stats(x):
        mean, var, _count = global_batch_stats(x)
        return mean, var
    return global_stats


def _stats_on_ranks(rank, world_size, fn, rows):
    x = _local_batch(rank, rows[rank])
    given = x.clone()
    with lands_on_wait() as started:  # an async all-reduce lands at wait()
        stats = attempt(fn, x)
        if stats is NOT_ATTEMPTED:
            return NOT_ATTEMPTED
        if never_waited(started):
            return NEVER_WAITED
    mean, var = stats
    return (torch.as_tensor(mean, dtype=torch.float64).detach(),
            torch.as_tensor(var, dtype=torch.float64).detach(),
            not torch.equal(x, given))


def _stats_hint(mean, var, batches, full, rank) -> str:
    local = batches[rank].double()
    if mean.shape != (CHANNELS,) or var.shape != (CHANNELS,):
        return (f"return one mean and one variance per channel, each of shape "
                f"({CHANNELS},): sum over the rows (dim 0) only, not over "
                "everything, and keep no extra dimension.")
    if not (torch.isfinite(mean).all() and torch.isfinite(var).all()):
        return ("a rank with no rows divides 0 by 0 in its own mean, and the "
                "all-reduce spreads that NaN to every rank: all-reduce sums and "
                "counts, and divide only by the global count.")
    close = lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-6)  # noqa: E731
    if len(batches) > 1 and len(local) and close(mean, local.mean(0)):
        return ("these are this rank's own statistics: all-reduce the count, "
                "the sum and the sum of squares first.")
    means = [b.double().mean(0) for b in batches if len(b)]
    if len(means) > 1 and close(mean, torch.stack(means).mean(0)):
        return ("you averaged the ranks' means, but the ranks hold different "
                "numbers of rows: all-reduce the sums and the count, then divide.")
    if close(var, full.var(0, unbiased=True)):
        return ("batch norm normalises with the biased variance: divide by the "
                "count N, not N - 1.")
    return ("var = E[x²] − E[x]² over the global batch: all-reduce the sum of "
            "squares too.")


def check_syncbn_stats(fn) -> Verdict:
    for rows in ROWS_CASES:
        results, problem = run_learner_code(_stats_on_ranks, len(rows), fn,
                                            trace=True, args=(rows,))
        if problem:
            return problem
        batches = [_local_batch(r, n) for r, n in enumerate(rows)]
        full = torch.cat(batches).double()
        want_mean, want_var = full.mean(0), full.var(0, unbiased=False)
        # float32 sums of N terms: each off by at most about N eps of E[x²]
        tol = 4 * len(full) * torch.finfo(torch.float32).eps * float(
            (full ** 2).mean(0).max())
        where = f"on {len(rows)} rank{'s' * (len(rows) > 1)} holding {list(rows)} rows"
        if NEVER_WAITED in [r if isinstance(r, str) else None for r in results]:
            return Verdict(WRONG, f"{where}: an async all-reduce was never "
                           f"waited for.\nHint: {UNWAITED_HINT}")
        for rank, (mean, var, changed) in enumerate(results):
            if changed:
                return Verdict(WRONG, f"{where}: rank {rank}'s rows changed "
                               "during your function.\nHint: compute x * x (or "
                               "x.square()) into a new tensor: x.pow_(2), x *= x "
                               "or x -= mean change the caller's batch, which "
                               "batch norm still has to normalise.")
            if mean.shape == want_mean.shape and var.shape == want_var.shape and (
                    (mean - want_mean).abs().max() <= tol
                    and (var - want_var).abs().max() <= tol):
                continue
            return Verdict(WRONG, f"{where}, rank {rank}: expected mean "
                           f"{want_mean.tolist()}, var {want_var.tolist()}; got "
                           f"mean {mean.tolist()}, var {var.tolist()}.\nHint: "
                           + _stats_hint(mean, var, batches, full, rank))
        for rank in range(len(rows)):
            sent = sum(e.nbytes for e in results.timeline.for_rank(rank)
                       if e.kind == "comm")
            if sent > STATS_BYTES_PER_RANK:
                return Verdict(WRONG, f"{where}: the right statistics, but rank "
                               f"{rank} handed {sent} bytes to collectives.\nHint: "
                               "send no rows: one all-reduce of [count, sum per "
                               f"channel, sum of squares per channel], "
                               f"{2 * CHANNELS + 1} numbers however many rows "
                               "a rank holds.")
    return Verdict(CORRECT, "global mean and biased variance with uneven batches, "
                            "one rank, and an empty rank; the rows left in place.")


register(Exercise(
    "syncbn_stats", "SyncBatchNorm's statistics", "my_global_stats",
    "ddp_teach.syncbn:global_batch_stats", check_syncbn_stats,
    ["All-reduce one tensor holding [count, sum per channel, sum of squares "
     "per channel].",
     "mean = sum / count; var = sum_sq / count − mean²."],
    adapt=mean_and_var))
