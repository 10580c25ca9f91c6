"""Checkers for notebook 01's collectives built from point-to-point messages
(the alpha-beta fit, appendix A1's exercise, is checked in nbA1_cost_models.py).

Each runs the learner's function where it would really run, on worker
processes, traced, over every world size from 1 to 5 and every case of
`CASES` (from cases.py, smallest first): 0-d, empty, 1, 2 (shorter than
most world sizes), 5, 7 and 13 (odd, prime: not divisible by 2, 3 or 4)
and 1000 values, 3 x 4 and 5 x 3 matrices, in float32, float64 and
int64, then strided and transposed views; then, on 2, 3 and 5 ranks, a
float tensor that requires grad, as a parameter does. A wrong verdict
shows the smallest case that fails.

What the references (`collectives.ring_allreduce`, `ring_all_gather`)
guarantee, and how each property is checked:

- values: the sum over ranks (exact: the inputs are small integers), or
  every rank's tensor at the index of the rank it came from;
- in place for the all-reduce: the caller's tensor holds the sum, as with
  `dist.all_reduce`; the all-gather returns a new list and no slot shares
  memory with the input (changing the input later must not change it);
- autograd: a tensor that requires grad works, and nothing is recorded
  (the sum lands in the tensor's data; the gathered slots hold data only),
  as torch's collectives do;
- concurrency: no rank waits for ever (a hang is reported with where each
  rank waited), and no buffer is read before its receive's wait()
  returned (harness.lands_on_wait fills it with poison until then);
- point-to-point only, and a ring's traffic: each rank sends and receives
  at most 2(p-1) chunks of ceil(n/p) elements each way for the all-reduce,
  and (p-1) tensors each way for the all-gather (from the trace's bytes);
- edge sizes: one rank (nothing to send), empty tensors, lengths below p;
- shapes: 0-d tensors, matrices and non-contiguous views (a transposed
  matrix's reshape(-1) is a copy, so an in-place answer must write back;
  a strided vector's is not contiguous, so isend / irecv need a copy);
  the all-gather's slots have the input's shape.

Processes with different hash seeds cannot differ here: nothing is hashed.
A wrong result is compared with what each typical mistake would produce
(an average instead of a sum, a missing own contribution, a chunk index
off by one, a list in the wrong order, the input aliased, a deadlock, a
buffer read early, a collective used, whole tensors sent, torch.chunk's
missing chunks, an in-place write autograd refuses), so that the hint names
the mistake actually made.
"""
import torch

from ddp_teach.exercises.cases import WORLD_SIZES, TensorCase, tensor_cases
from ddp_teach.exercises.harness import (DEADLOCK_HINT, READ_BEFORE_WAIT_HINT,
                                        attempt, describe_deadlock, is_poisoned,
                                        lands_on_wait, run_learner_code)
from ddp_teach.exercises.nb01_ring_mistakes import (all_gather_traffic,
                                                   diagnose_all_gather,
                                                   diagnose_all_reduce,
                                                   ring_traffic)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

# every contiguous shape of cases.SHAPES (0-d, empty, one element, fewer
# elements than ranks, odd and prime lengths, two matrices, 1000) in each
# dtype, then the non-contiguous views (every second element of a vector,
# whose reshape(-1) is that same strided view; a transposed matrix, whose
# reshape(-1) is a copy) in a float and an integer dtype; smallest first
CASES = sorted(tensor_cases(("float32", "float64", "int64"), layouts=("contiguous",))
               + tensor_cases(("float32", "int64"), shapes=((2,), (5,), (13,), (3, 4), (5, 3)),
                              layouts=("strided", "transposed")),
               key=TensorCase.order)
# checked once the values are right
GRAD_CASES, GRAD_WORLD_SIZES = [TensorCase((5,), "float32", requires_grad=True)], (2, 3, 5)
CHECK_TIMEOUT_S = 5.0
ALONE_HINT = ("with one rank there is nobody to send to; return early when "
              "world_size == 1.")
P2P_CALLS = {"isend", "irecv", "send", "recv", "batch_isend_irecv"}
# the reference's length check (collectives._require_same_numel), and a call
# that moves no data
NOT_DATA = {"size check", "barrier"}
SHARED_SLOTS_HINT = (
    "two slots of the list are one buffer: receive each message into a "
    "buffer of its own (torch.empty_like(tensor) per step). A buffer reused "
    "at every step is overwritten, even while it is still being sent on.")
ERROR_HINTS = {  # a piece of an error's text: the mistake it shows
    "has to be contiguous": (
        "this case's tensor is a non-contiguous view, and isend / irecv need "
        "contiguous buffers. Work on a contiguous flat copy, flat = "
        "tensor.detach().reshape(-1).contiguous() (reshape alone keeps a "
        "strided vector strided), and at the end copy the result back into "
        "the tensor: tensor.copy_(flat.view_as(tensor))."),
    "index out of range": (
        "an index past the last chunk: tensor.chunk(p) and tensor.split(k) "
        "give fewer than p pieces when the tensor is shorter than p; "
        "tensor.tensor_split(p) always gives p (some of them empty)."),
    "requires grad is being used in an in-place operation": (
        "the tensor requires grad (a parameter does), and autograd refuses "
        "in-place writes to it. dist.all_reduce works on the data outside "
        "autograd: do the same on tensor.detach(), which shares its memory."),
}


def _on(world_size: int) -> str:
    return f"on {world_size} rank{'s' * (world_size > 1)}"


def _show(t) -> str:
    if isinstance(t, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in t) + "]"
    if not isinstance(t, torch.Tensor):
        return repr(t)[:80]
    values = t.detach().flatten().tolist()
    more = f", … ({t.numel()} values)" if len(values) > 6 else ""
    return "[" + ", ".join(f"{v:g}" for v in values[:6]) + more + "]"


def _shares_memory(a, b) -> bool:
    """Whether tensors a and b overlap in memory (views of one buffer that
    cover different elements, such as rows of one matrix, do not)."""
    if not (isinstance(a, torch.Tensor) and a.numel() and b.numel()) or \
            a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return (a.data_ptr() < b.data_ptr() + _extent(b)
            and b.data_ptr() < a.data_ptr() + _extent(a))


def _extent(t) -> int:
    """Bytes from t's first element to just past its last one."""
    span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (span + 1) * t.element_size()


def _outcome(result, tensor):
    """What the checker needs of one call's result, picklable: the value
    (detached) and, for a returned list, whether a slot carries autograd
    history or shares memory with the input or with another slot."""
    parts = result if isinstance(result, (list, tuple)) else [result]
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    value = ([p.detach() if isinstance(p, torch.Tensor) else p for p in result]
             if isinstance(result, (list, tuple))
             else result.detach() if isinstance(result, torch.Tensor) else result)
    listed = isinstance(result, (list, tuple))  # else the tensor itself
    return {"value": value,
            "grad": listed and any(t.requires_grad for t in tensors),
            "aliases_input": listed and any(_shares_memory(t, tensor)
                                            for t in tensors),
            "shared_slots": listed and any(
                _shares_memory(a, b) for i, a in enumerate(tensors)
                for b in tensors[i + 1:])}


def _on_ranks(rank, world_size, fn, cases, in_place):
    """Worker side: the learner's fn on every case; what it produced. A
    received message lands only at wait() (see harness.lands_on_wait); an
    error says which case raised it."""
    produced = []
    for case in cases:
        tensor = case.make(rank)
        with lands_on_wait():
            try:
                returned = attempt(fn, tensor)
            except Exception as error:
                error.add_note(f"(the checker's input here: "
                               f"{case.describe()})")
                raise
        if returned is NOT_ATTEMPTED:
            return NOT_ATTEMPTED
        produced.append(_outcome(tensor if in_place else returned, tensor))
    return produced


def _with_error_hint(verdict: Verdict) -> Verdict:
    for sign, hint in ERROR_HINTS.items():
        if sign in verdict.message and "Hint:" not in verdict.message:
            return Verdict(verdict.status, f"{verdict.message}\nHint: {hint}")
    return verdict


def check_on_ranks(fn, in_place: bool, expected, diagnose, traffic) -> Verdict:
    """Run fn on every world size and case, then on a tensor that requires
    grad; the first wrong result wins. expected(inputs) is the right
    answer, diagnose(outcome, inputs, rank) None when the outcome is right,
    else a hint for the mistake it looks like; traffic(numel, elem_bytes, p)
    the most bytes a rank may send and receive for one case."""
    for cases, world_sizes, alone in ((CASES, WORLD_SIZES, ALONE_HINT),
                                      (GRAD_CASES, GRAD_WORLD_SIZES, None)):
        runs = {}
        for world_size in world_sizes:
            runs[world_size], problem = run_learner_code(
                _on_ranks, world_size, fn, timeout=CHECK_TIMEOUT_S, trace=True,
                args=(cases, in_place), on_hang=describe_deadlock,
                alone_hint=alone)
            if problem:
                return _with_error_hint(problem)
        # every world size's values before any of their communication: a
        # wrong value names the mistake better than the calls that made it;
        # but the contiguous tensors' values first, then the calls, then the
        # views' values: gloo's all_reduce reads a strided view's storage as
        # if it were contiguous and sums the wrong elements, so an answer
        # that calls it fails first on a view, for the call's sake
        for check in (lambda ws, r: _wrong_value(r, cases, ws, expected, diagnose,
                                                 contiguous_only=True),
                      lambda ws, r: _collective_used(r.timeline, ws),
                      lambda ws, r: _wrong_value(r, cases, ws, expected, diagnose),
                      lambda ws, r: _too_many_bytes(r.timeline, cases, ws,
                                                    traffic)):
            problem = next(filter(None, (check(ws, r) for ws, r in runs.items())),
                           None)
            if problem:
                return Verdict(WRONG, problem)
    return Verdict(CORRECT, f"tried world sizes {WORLD_SIZES}; {len(CASES)} "
                            "tensors from the smallest up: 0-d, empty, 1, 2, "
                            "5, 7, 13 and 1000 values, 3 x 4 and 5 x 3 "
                            f"matrices, in {', '.join(sorted({c.dtype for c in CASES}))}; "
                            "strided and transposed views; and a tensor "
                            "that requires grad. Point-to-point messages only, "
                            "no more bytes than the algorithm needs.")


def _wrong_value(results, cases, world_size, expected, diagnose,
                 contiguous_only: bool = False) -> str | None:
    """What a wrong result looked like on the smallest case that fails
    (cases are ordered smallest first), with the hint that fits, or None.
    The hint is read on the largest case that fails (contiguous first):
    on a tiny tensor different mistakes look alike (a chunk off by one
    and a missing contribution give the same single value)."""
    failing = []  # (case index, rank, hint), smallest case first
    for index, case in enumerate(cases):
        if contiguous_only and case.layout != "contiguous":
            continue
        inputs = [case.make(r) for r in range(world_size)]
        for rank in range(world_size):
            outcome = results[rank][index]
            hint = (SHARED_SLOTS_HINT if outcome["shared_slots"]
                    else READ_BEFORE_WAIT_HINT if is_poisoned(outcome["value"])
                    else diagnose(outcome, inputs, rank))
            if hint:
                failing.append((index, rank, hint))
                break
    if not failing:
        return None
    index, rank, _ = failing[0]
    largest_index, _, hint = min(failing, key=lambda f: (
        -cases[f[0]].numel, cases[f[0]].layout != "contiguous", f[0]))
    case = cases[index]
    inputs = [case.make(r) for r in range(world_size)]
    read_on = ("" if largest_index == index else
               f" (read on the largest case that fails, "
               f"{cases[largest_index].describe()}, where mistakes are told "
               f"apart more easily)")
    return (f"{_on(world_size)}, rank {rank}, {case.describe()} (the "
            f"smallest case that fails):\n"
            f"  this rank's input  {_show(inputs[rank])}\n"
            f"  expected           {_show(expected(inputs))}\n"
            f"  got                {_show(results[rank][index]['value'])}\n"
            f"Hint{read_on}: {hint}")


def _collective_used(timeline, world_size) -> str | None:
    """None when every rank used only point-to-point calls, else which
    collective a rank called, with a hint."""
    for rank in range(world_size):
        events = [e for e in timeline.for_rank(rank) if e.kind == "comm"]
        used = sorted({e.name for e in events} - P2P_CALLS - NOT_DATA)
        if used:
            return (f"{_on(world_size)}, rank {rank} called {', '.join(f'dist.{n}' for n in used)}."
                    "\nHint: the exercise builds the collective from "
                    "point-to-point messages alone: dist.isend / dist.irecv "
                    "(or send / recv).")
    return None


def _too_many_bytes(timeline, cases, world_size, traffic) -> str | None:
    """None when no rank moved more bytes than the algorithm needs, else
    how many it moved, with a hint."""
    allowed = sum(traffic(case.numel, torch.tensor([], dtype=getattr(
        torch, case.dtype)).element_size(), world_size) for case in cases)
    for rank in range(world_size):
        events = [e for e in timeline.for_rank(rank) if e.kind == "comm"]
        moved = _bytes_moved(events)
        if moved > allowed:
            return (f"{_on(world_size)}, rank {rank} sent and received {moved:,} bytes over all "
                    f"the cases, where the algorithm needs at most "
                    f"{allowed:,}.\nHint: send one chunk per step, not the "
                    "whole tensor, and never the same data twice.")
    return None


def _bytes_moved(events) -> int:
    """Bytes sent and received in point-to-point calls (the trace gives each
    op of a batch_isend_irecv its own bytes)."""
    return sum(e.nbytes for e in events if e.name in P2P_CALLS)


register(Exercise(
    "ring_allreduce", "Ring all-reduce from isend/irecv", "my_ring_allreduce",
    "ddp_teach.collectives:ring_allreduce",
    lambda fn: check_on_ranks(fn, True, sum, diagnose_all_reduce, ring_traffic),
    ["Split the flat tensor into world_size chunks with tensor_split(p): "
     "it gives p chunks even when the length is smaller than p.",
     "Phase 1 (reduce-scatter), p-1 steps: send one chunk to (rank+1) % p, "
     "receive one from (rank-1) % p and add it to your copy of that chunk.",
     "At step s rank r sends chunk (r - s) % p and receives chunk (r - s - 1) % p. "
     "Phase 2 (all-gather) is the same walk with copy instead of add, "
     "starting from chunk (r + 1) % p.",
     DEADLOCK_HINT,
     "Like dist.all_reduce, work on tensor.detach(): the same memory, and "
     "autograd neither records nor refuses the in-place adds."]))
register(Exercise(
    "all_gather_p2p", "All-gather from point-to-point messages", "my_all_gather",
    "ddp_teach.collectives:ring_all_gather",
    lambda fn: check_on_ranks(fn, False, list, diagnose_all_gather,
                              all_gather_traffic),
    ["Start with a list of p slots; a copy of your own tensor goes in slot rank.",
     "Pass tensors around the ring: p-1 steps, each sending the tensor you "
     "received last to the right and receiving a new one, into a buffer of "
     "its own, from the left.",
     "Post the isend and the irecv of a step before waiting on either."]))
