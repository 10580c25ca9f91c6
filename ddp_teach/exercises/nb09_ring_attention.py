"""Checker for notebook 09's ring attention (context parallelism), on real ranks.

`my_ring_attention(q, k, v)`: rank r holds the r-th chunk of a long
sequence, its queries, keys and values, shaped (batch, heads, tokens,
head dim); it returns attention for its own queries over the WHOLE
sequence, softmax(q K^T / sqrt(d)) V, without any rank ever holding all of
K and V. The K/V chunks travel around the ring, one step at a time, and
each rank merges the partial results with the online softmax: a running
maximum m, a running sum l of exp(score - m) and a running output, both
rescaled by exp(m_old - m_new) whenever the maximum grows (Milakov and
Gimelshein, "Online normalizer calculation for softmax", 2018; Liu, Zaharia
and Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context", 2023). The reference, `ring_attention` below, lives here with its
checker: no course module needs it.

What is checked, on 1 to 5 ranks (3 and 5 not powers of two) and the
cases of nb09_ring_attention_cases.py (float32 and float64; V's head dim
differs from Q's, so the output must take V's; a case with scores in the
hundreds, where exp overflows float32 unless the running maximum is
subtracted):

- values: equal to torch's scaled_dot_product_attention on the gathered
  sequence in float64, this rank's rows, within the dtype's rounding of
  the scores carried through exp and a sum over the keys (`tolerance`);
- communication: point-to-point only, and each rank sends exactly p-1
  K/V chunks and receives as many (bytes from the trace): a collective
  that gathers K and V puts the whole sequence on every rank, which is
  what context parallelism exists to avoid;
- concurrency: every isend and irecv is waited (a receive lands only at
  its wait(), harness.lands_on_wait; a send not waited is counted), and a
  hang is reported with the ring's direction as the hint.

A wrong value is compared with what the usual mistakes give: no running
maximum (overflow), no rescale of what was accumulated, partial outputs
averaged, only this rank's own chunk, one chunk left out.
"""
import contextlib
import math

import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import (READ_BEFORE_WAIT_HINT, attempt, is_poisoned,
                                        lands_on_wait, run_learner_code)
from ddp_teach.exercises.nb09_ring_attention_cases import (CASES, LARGE, expected_attention,
                                                          make_inputs, mistakes, tolerance)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

WORLD_SIZES = (1, 2, 3, 4, 5)  # 3 and 5 not powers of two
CHECK_TIMEOUT_S = 10.0
P2P_CALLS = {"isend", "irecv", "send", "recv", "batch_isend_irecv"}
NOT_DATA = {"barrier"}
RING_HINT = ("each rank sends its K/V to the next rank, (rank + 1) % p, and "
             "receives from the previous one, (rank - 1) % p; post the isend "
             "and irecv of a step together (or in one batch_isend_irecv), "
             "then wait() on both.")


def ring_attention(q, k, v):
    """Attention of this rank's queries over every rank's keys and values,
    the K/V chunks passed around the ring, merged with the online softmax."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    running_max = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
    running_sum = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype)
    k, v = k.contiguous(), v.contiguous()
    for step in range(world_size):
        if step < world_size - 1:  # pass this chunk on while computing with it
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % world_size),
                dist.P2POp(dist.isend, v, (rank + 1) % world_size),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world_size),
                dist.P2POp(dist.irecv, next_v, (rank - 1) % world_size)])
        scores = q @ k.transpose(-2, -1) * scale
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        weights = torch.exp(scores - new_max)
        rescale = torch.exp(running_max - new_max)  # what was summed so far
        running_sum = running_sum * rescale + weights.sum(-1, keepdim=True)
        out = out * rescale + weights @ v
        running_max = new_max
        if step < world_size - 1:
            for work in works:
                work.wait()
            k, v = next_k, next_v
    return out / running_sum


class _Watched:
    """A work handed to the learner, noting whether it was waited on (or
    polled to completion)."""

    def __init__(self, work):
        self._work, self.waited = work, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self._work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        self.waited = self.waited or done
        return done

    def __getattr__(self, name):
        return getattr(self._work, name)


class _WatchedOp:
    """isend or irecv for the learner: its works are watched; it compares
    equal to the function it wraps, so that `dist.P2POp` accepts it."""

    def __init__(self, inner, works):
        self.inner, self._works = inner, works
        self.__name__ = getattr(inner, "__name__", "p2p")

    def __call__(self, *args, **kwargs):
        work = self.inner(*args, **kwargs)
        self._works.append(_Watched(work))
        return self._works[-1]

    def __eq__(self, other):
        return other is self or other is self.inner or self.inner == other

    __hash__ = object.__hash__


@contextlib.contextmanager
def _watching_waits():
    """Inside: every work that isend, irecv and batch_isend_irecv return is
    watched; yields the list of them."""
    works = []
    real = dist.isend, dist.irecv, dist.batch_isend_irecv
    isend, irecv = _WatchedOp(real[0], works), _WatchedOp(real[1], works)

    def batch_isend_irecv(ops):
        plain = [dist.P2POp(op.op.inner if isinstance(op.op, _WatchedOp) else op.op,
                            op.tensor, op.peer, op.group, op.tag) for op in ops]
        watched = [_Watched(w) for w in real[2](plain)]
        works.extend(watched)
        return watched
    dist.isend, dist.irecv, dist.batch_isend_irecv = isend, irecv, batch_isend_irecv
    try:
        yield works
    finally:
        dist.isend, dist.irecv, dist.batch_isend_irecv = real


def _on_ranks(rank, world_size, fn):
    produced = []
    for case in CASES:
        (q, k, v), _ = make_inputs(rank, world_size, case)
        with lands_on_wait(), _watching_waits() as works:
            out = attempt(fn, q, k, v)
        if out is NOT_ATTEMPTED:
            return NOT_ATTEMPTED
        produced.append({"out": out.detach() if isinstance(out, torch.Tensor) else out,
                         "unwaited": sum(not w.waited for w in works)})
    return produced


def _value_problem(got, rank, world_size, case) -> str | None:
    want = expected_attention(rank, world_size, case)
    dtype = getattr(torch, case[5])
    if not isinstance(got, torch.Tensor):
        return f"the function returned a {type(got).__name__}; return a tensor."
    if got.shape != want.shape:
        return (f"the output has shape {tuple(got.shape)}, where attention gives "
                f"{tuple(want.shape)}: (batch, heads, tokens, V's head dim).")
    if got.dtype != dtype:
        return f"the output is {got.dtype}; return the inputs' dtype, {dtype}."
    if (got.double() - want).abs().max() <= tolerance(rank, world_size, case):
        return None
    if is_poisoned(got):
        if case == LARGE:
            return ("the output is not finite with scores in the hundreds: "
                    "exp of a large score overflows. Subtract the running "
                    "maximum from the scores before exp, and keep it as you go.")
        return READ_BEFORE_WAIT_HINT
    for wrong, hint in mistakes(rank, world_size, case):
        if torch.allclose(got.double(), wrong, atol=1e-4, rtol=0):
            return hint
    return ("compare with the ring schedule: at step s rank r holds the K/V "
            "chunk of rank (r - s) % p; merge each chunk's scores into a "
            "running maximum, sum of exps and output, and divide at the end.")


def _traffic_problem(timeline, world_size) -> str | None:
    """Exactly p-1 K/V chunks out and in per rank, point-to-point only."""
    chunk = sum(batch * heads * tokens * (d + d_v) * _size(dtype)  # K and V
                for batch, heads, tokens, d, d_v, dtype, _ in CASES)
    want = 2 * (world_size - 1) * chunk  # sent and received
    for rank in range(world_size):
        events = [e for e in timeline.for_rank(rank) if e.kind == "comm"]
        used = sorted({e.name for e in events} - P2P_CALLS - NOT_DATA)
        if used:
            return (f"on {world_size} ranks, rank {rank} called "
                    f"{', '.join('dist.' + n for n in used)}: gathering K and V "
                    "puts the whole sequence on every rank, the memory context "
                    "parallelism exists to save. Pass one chunk at a time with "
                    "isend / irecv.")
        moved = sum(e.nbytes for e in events if e.name in P2P_CALLS)
        if moved != want:
            return (f"on {world_size} ranks, rank {rank} sent and received "
                    f"{moved:,} bytes over the cases, where p-1 = {world_size - 1} "
                    f"K/V chunks each way make {want:,}. Send this rank's K and "
                    "V on at each of the first p-1 steps, nothing more.")
    return None


def _size(dtype: str) -> int:
    return torch.tensor([], dtype=getattr(torch, dtype)).element_size()


def _on_hang(err, world_size, timeout) -> str:
    return (f"your function did not finish within {timeout:g} s on {world_size} "
            f"ranks: the messages never met.\nHint: {RING_HINT}")


def check_ring_attention(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_on_ranks, world_size, fn,
                                            timeout=CHECK_TIMEOUT_S, trace=True,
                                            on_hang=_on_hang)
        if problem:
            return problem
        for rank, produced in enumerate(results):
            for case, got in zip(CASES, produced):
                hint = _value_problem(got["out"], rank, world_size, case)
                if hint:
                    shape = tuple(make_inputs(rank, world_size, case)[0][0].shape)
                    return Verdict(WRONG, f"on {world_size} ranks, rank {rank}, "
                                   f"q of shape {shape} in {case[5]}:\nHint: {hint}")
                if got["unwaited"]:
                    return Verdict(WRONG, f"on {world_size} ranks, rank {rank}: "
                                   f"{got['unwaited']} isend / irecv works were "
                                   "never waited on. A send's buffer must not "
                                   "change, and a receive's must not be read, "
                                   "until wait() returns: wait on every work.")
        problem = _traffic_problem(results.timeline, world_size)
        if problem:
            return Verdict(WRONG, problem)
    return Verdict(CORRECT, "equal to attention over the whole sequence on 1 to 5 "
                            "ranks, in float32 and float64, with scores in the "
                            "hundreds too; p-1 K/V chunks sent and received per "
                            "rank, point-to-point, every work waited.")


register(Exercise(
    "ring_attention", "Ring attention from isend/irecv", "my_ring_attention",
    "ddp_teach.exercises.nb09_ring_attention:ring_attention", check_ring_attention,
    ["Keep three running tensors for your queries: the maximum score m so far, "
     "the sum l of exp(score - m), and the output o (sum of exp(score - m) V).",
     "For each K/V chunk: scores = q @ k.transpose(-2, -1) / sqrt(d); "
     "new_m = max(m, scores.amax(-1)); multiply l and o by exp(m - new_m), "
     "add the chunk's exp(scores - new_m) sums and products; at the end "
     "return o / l.",
     "p steps: compute with the chunk in hand; at the first p-1 also send "
     "it to (rank + 1) % p and receive the next from (rank - 1) % p "
     "(dist.batch_isend_irecv with two isends and two irecvs), and wait on "
     "every work before using what arrived."]))
