"""Checker for notebook 04's gradient accumulation with `no_sync`, on real
ranks (SyncBatchNorm's statistics are checked in nb04_data_and_sync.py).

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
data differ by construction. Wrong answers are compared with the typical
mistakes (every micro-batch all-reduced or none, the forward outside
no_sync, the loss not divided, the gradients zeroed between micro-batches,
an all-reduce by hand, a hard-coded count, the list emptied, one backward
of the summed losses) so that the hint names the one made.
"""
import torch

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import attempt, run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

COUNTS = (1, 2, 3)  # micro-batches per call, small to large
WORLD_SIZES = (1, 2, 3)
GRAD_ATOL = 1e-6  # float32 rounding of a few gradient terms of order 1


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1))


def _micro_batches(rank, count):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(2, 4, generator=g) for _ in range(count)]


def _accumulate_on_ranks(rank, world_size, fn):
    """For each count of COUNTS micro-batches: the gradients, when the call began and
    ended (to count its all-reduces in the trace), how often it entered
    no_sync, and whether it changed the caller's list."""
    from torch.nn.parallel import DistributedDataParallel
    from ddp_teach.tracing import now
    runs = []
    for count in COUNTS:
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
    """Small to large: every world size of WORLD_SIZES, each with 1, 2 and 3
    micro-batches (a fresh model each call), so the first mistake shown is
    on the smallest case that has it."""
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_accumulate_on_ranks, world_size,
                                            fn, timeout=15.0, trace=True)
        if problem:
            return problem
        for phase, count in enumerate(COUNTS):
            run = results[0][phase]
            events = [e.name for e in results.timeline.for_rank(0)
                      if e.kind == "comm" and run["start"] <= e.start <= run["end"]]
            reduces = [name for name in events if name.startswith("ddp bucket")]
            syncs = len(reduces) // max(1, len(set(reduces)))
            hint = _no_sync_hint(run, count, syncs, events.count("all_reduce"),
                                 world_size)
            if hint:
                return Verdict(WRONG, f"with {count} micro-batch"
                               f"{'es' * (count > 1)} on {world_size} rank"
                               f"{'s' * (world_size > 1)}: {hint}")
    return Verdict(CORRECT, f"{', '.join(map(str, COUNTS))} micro-batches on "
                            f"{', '.join(map(str, WORLD_SIZES))} ranks: one "
                            "all-reduce each time, a backward per micro-batch, "
                            "the full-batch gradient, the list left as it was.")


def _no_sync_hint(run, count, syncs, by_hand, world_size) -> str | None:
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
    if _same_grads(got, _expected_grads(world_size, count)):
        return None
    if count > 1 and _same_grads(got, _expected_grads(world_size, count, divide=False)):
        return ("the gradients are the SUM over micro-batches.\nHint: divide "
                "each micro-batch's loss by the number of micro-batches, so "
                "the accumulated gradient is a mean.")
    if count > 1 and _same_grads(got, _expected_grads(world_size, count, only_last=True)):
        return ("only the last micro-batch's gradient is left.\nHint: do not "
                "zero the gradients between micro-batches: backward adds into "
                ".grad, and that sum is the point.")
    differ = first_difference(got, _expected_grads(world_size, count),
                              ["0.weight", "0.bias", "2.weight", "2.bias"])
    return (f"one all-reduce, but the gradients differ from the full batch's: "
            f"{differ}.\nHint: loss = model(x).square().mean() / len(micro_batches) for "
            "each micro-batch.")


register(Exercise(
    "no_sync_accumulation", "Gradient accumulation with no_sync",
    "my_accumulate", "ddp_teach.ddp:accumulate", check_no_sync,
    ["Loop over the micro-batches; divide each loss by their number.",
     "Every forward and backward but the last goes inside "
     "`with model.no_sync():`."]))
