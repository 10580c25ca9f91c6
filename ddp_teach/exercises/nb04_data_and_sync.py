"""Checkers for notebook 04's exercises on real ranks: SyncBatchNorm's
global statistics, and gradient accumulation with `no_sync` (the sampler's
split is checked in nb04_sampler.py).

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

`no_sync_accumulation`: `my_accumulate(model, micro_batches)` runs on 2
ranks with torch's DDP, traced, for 3 micro-batches and for 1. The
reference (`ddp.accumulate`) guarantees:

- exactly one gradient all-reduce per call, made by DDP during the last
  backward (so none by hand);
- one backward pass per micro-batch (counted by a hook on a weight), the
  ones before the last inside `no_sync()` (entered at least once): a
  single backward of the summed losses holds every micro-batch's
  activations at once, which is what accumulation avoids;
- the gradients equal the full batch's average over micro-batches and
  ranks (each loss divided by the number of micro-batches);
- with one micro-batch, that one is the last and is all-reduced;
- the caller's list of micro-batches is left as it was.

Hash seeds cannot change these results (nothing is hashed); the ranks'
data differ by construction.

Wrong answers are compared with the typical mistakes (local or
mean-of-means statistics, the unbiased variance, a NaN from an empty rank,
the input changed, the rows gathered; every micro-batch all-reduced or
none, the forward outside no_sync, the loss not divided, the gradients
zeroed between micro-batches, an all-reduce by hand, a hard-coded count,
the list emptied) so that the hint names the one made.
"""
import torch

from ddp_teach.exercises.harness import attempt, run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

CHANNELS = 3
# rows on each rank: uneven; one rank alone; an empty rank beside a big one
ROWS_CASES = [(2, 3), (2, 3, 4), (4,), (50, 0, 3)]
STATS_BYTES_PER_RANK = 3 * (2 * CHANNELS + 1) * 8  # three all-reduces of float64
MICRO_BATCHES = 3
GRAD_ATOL = 1e-6  # float32 rounding of a few gradient terms of order 1


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
    stats = attempt(fn, x)
    if stats is NOT_ATTEMPTED:
        return NOT_ATTEMPTED
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
    if len(local) and close(mean, local.mean(0)):
        return ("these are this rank's own statistics: all-reduce the count, "
                "the sum and the sum of squares first.")
    means = [b.double().mean(0) for b in batches if len(b)]
    if close(mean, torch.stack(means).mean(0)):
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


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1))


def _micro_batches(rank, count):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(2, 4, generator=g) for _ in range(count)]


def _accumulate_on_ranks(rank, world_size, fn):
    """For 3 micro-batches, then 1: the gradients, when the call began and
    ended (to count its all-reduces in the trace), how often it entered
    no_sync, and whether it changed the caller's list."""
    from torch.nn.parallel import DistributedDataParallel
    from ddp_teach.tracing import now
    runs = []
    for count in (MICRO_BATCHES, 1):
        model = DistributedDataParallel(_model())
        entered, real_no_sync = [0], model.no_sync

        def counting_no_sync():
            entered[0] += 1
            return real_no_sync()
        model.no_sync = counting_no_sync
        backwards = [0]  # a gradient of the first weight per backward pass
        next(model.module.parameters()).register_hook(
            lambda grad: backwards.__setitem__(0, backwards[0] + 1))
        batches = _micro_batches(rank, count)
        given = list(batches)
        start = now()
        if attempt(fn, model, batches) is NOT_ATTEMPTED:
            return NOT_ATTEMPTED
        runs.append({"grads": [None if p.grad is None else p.grad.clone()
                               for p in model.parameters()],
                     "start": start, "end": now(), "no_sync": entered[0],
                     "backwards": backwards[0],
                     "list_changed": len(batches) != len(given) or any(
                         a is not b for a, b in zip(batches, given))})
    return runs


def _expected_grads(world_size, count, only_last=False, divide=True):
    total = None
    for rank in range(world_size):
        model = _model()
        batches = _micro_batches(rank, count)
        for x in batches[-1:] if only_last else batches:
            loss = model(x).square().mean()
            (loss / count if divide else loss).backward()
        grads = [p.grad for p in model.parameters()]
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    return [t / world_size for t in total]


def _same_grads(got, want) -> bool:
    return all(g is not None and torch.allclose(g, w, atol=GRAD_ATOL)
               for g, w in zip(got, want))


def check_no_sync(fn) -> Verdict:
    results, problem = run_learner_code(_accumulate_on_ranks, 2, fn,
                                        timeout=15.0, trace=True)
    if problem:
        return problem
    for phase, count in enumerate((MICRO_BATCHES, 1)):
        run = results[0][phase]
        events = [e.name for e in results.timeline.for_rank(0)
                  if e.kind == "comm" and run["start"] <= e.start <= run["end"]]
        reduces = [name for name in events if name.startswith("ddp bucket")]
        syncs = len(reduces) // max(1, len(set(reduces)))
        hint = _no_sync_hint(run, count, syncs, events.count("all_reduce"))
        if hint:
            return Verdict(WRONG, f"with {count} micro-batch{'es' * (count > 1)} "
                           f"on 2 ranks: {hint}")
    return Verdict(CORRECT, f"{MICRO_BATCHES} micro-batches, then 1: one "
                            "all-reduce each time, the full-batch gradient, the "
                            "list left as it was.")


def _no_sync_hint(run, count, syncs, by_hand) -> str | None:
    if run["list_changed"]:
        return ("your function changed the list of micro-batches it was given "
                "(pop? remove?).\nHint: loop over it without changing it; the "
                "caller may need it again, and len(micro_batches) must stay "
                "the number you divide by.")
    if by_hand:
        return (f"you called dist.all_reduce yourself ({by_hand} times).\nHint: "
                "let DDP do it: run the last micro-batch outside no_sync(), and "
                "its backward all-reduces everything accumulated so far.")
    if syncs == 0:
        return ("the gradients were never all-reduced.\nHint: run the LAST "
                "micro-batch outside no_sync() (with one micro-batch, that is "
                "the only one: count with len(micro_batches), not a number "
                "typed in): its backward reduces everything accumulated.")
    if syncs > 1 and run["no_sync"]:
        return (f"the gradients were all-reduced {syncs} times, although you "
                "entered no_sync().\nHint: torch's DDP decides in forward "
                "whether the next backward all-reduces: run model(x) inside the "
                "with-block too, not only the backward.")
    if syncs > 1:
        return (f"the gradients were all-reduced {syncs} times.\nHint: wrap "
                "every micro-batch but the last in `with model.no_sync():`.")
    if count > 1 and run["backwards"] != count:
        return (f"{run['backwards']} backward pass{'es' * (run['backwards'] != 1)} "
                f"for {count} micro-batches.\nHint: accumulation is one forward "
                "and one backward per micro-batch: a backward of the summed "
                "losses gives the same gradient but keeps every micro-batch's "
                "activations alive at once, which is the memory accumulation "
                "exists to save. Call backward() once per micro-batch.")
    if count > 1 and not run["no_sync"]:
        return ("one all-reduce, but your function never entered no_sync().\n"
                "Hint: the exercise is DDP's way to skip the all-reduce of the "
                "micro-batches before the last: run their forward and "
                "backward inside `with model.no_sync():`.")
    got = run["grads"]
    if _same_grads(got, _expected_grads(2, count)):
        return None
    if count > 1 and _same_grads(got, _expected_grads(2, count, divide=False)):
        return ("the gradients are the SUM over micro-batches.\nHint: divide "
                "each micro-batch's loss by the number of micro-batches, so "
                "the accumulated gradient is a mean.")
    if count > 1 and _same_grads(got, _expected_grads(2, count, only_last=True)):
        return ("only the last micro-batch's gradient is left.\nHint: do not "
                "zero the gradients between micro-batches: backward adds into "
                ".grad, and that sum is the point.")
    return ("one all-reduce, but the gradients differ from the full batch's."
            "\nHint: loss = model(x).square().mean() / len(micro_batches) for "
            "each micro-batch.")


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
     "Every forward and backward but the last goes inside "
     "`with model.no_sync():`."]))
