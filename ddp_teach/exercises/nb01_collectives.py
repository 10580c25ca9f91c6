"""Checkers for notebook 01's exercises: collectives from point-to-point
messages, and the alpha-beta model fitted to their times.

Each checker runs the learner's function where it would really run (on worker
processes, for the collectives) over inputs chosen to expose typical
mistakes: a world size of 1, tensors shorter than the number of ranks or not
divisible by it, integer dtypes. When a result is wrong it is compared with
what each typical mistake would produce (an average instead of a sum, a
missing own contribution, a chunk index off by one, a list in the wrong
order, a deadlock, a buffer read before its receive finished), so that
the hint names the mistake actually made.
"""
import numpy as np
import torch

from ddp_teach.exercises.harness import (DEADLOCK_HINT, READ_BEFORE_WAIT_HINT,
                                        attempt, describe_deadlock, is_poisoned,
                                        lands_on_wait, run_learner_code)
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE, WRONG,
                                         Exercise, Verdict, register)

WORLD_SIZES = (1, 2, 3, 4)
CASES = [(n, d) for n in (0, 1, 2, 5, 1000)
         for d in ("float32", "float64", "int64")]
CHECK_TIMEOUT_S = 5.0
ALONE_HINT = ("with one rank there is nobody to send to; return early when "
              "world_size == 1.")
def make_input(rank: int, numel: int, dtype: str) -> torch.Tensor:
    """Small integers that differ per rank, so float sums are exact."""
    values = (torch.arange(numel) % 7 + 1) * (rank + 1) + rank
    return values.to(getattr(torch, dtype))


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.allclose(a, b) if a.is_floating_point() else torch.equal(a, b)


def _show(t) -> str:
    if isinstance(t, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in t) + "]"
    if not isinstance(t, torch.Tensor):
        return repr(t)[:80]
    values = t.flatten().tolist()
    more = f", … ({t.numel()} values)" if len(values) > 6 else ""
    return "[" + ", ".join(f"{v:g}" for v in values[:6]) + more + "]"


def _on_ranks(rank, world_size, fn, cases, in_place):
    """Worker side: the learner's fn on every case; what it produced. A
    received message lands only at wait() (see harness.lands_on_wait)."""
    produced = []
    for numel, dtype in cases:
        tensor = make_input(rank, numel, dtype)
        with lands_on_wait():
            returned = attempt(fn, tensor)
        if returned is NOT_ATTEMPTED:
            return NOT_ATTEMPTED
        produced.append(tensor if in_place else returned)
    return produced


def check_on_ranks(fn, in_place: bool, expected, diagnose) -> Verdict:
    """Run fn on every world size and case; the first wrong result wins.
    expected(inputs) is the right answer, diagnose(got, inputs, rank) None
    when `got` is right, else a hint for the mistake it looks like."""
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(
            _on_ranks, world_size, fn, timeout=CHECK_TIMEOUT_S,
            args=(CASES, in_place), on_hang=describe_deadlock,
            alone_hint=ALONE_HINT)
        if problem:
            return problem
        # largest tensors first: on a tiny tensor different mistakes look alike
        for index, (numel, dtype) in sorted(enumerate(CASES),
                                            key=lambda case: -case[1][0]):
            inputs = [make_input(r, numel, dtype) for r in range(world_size)]
            for rank in range(world_size):
                got = results[rank][index]
                problem = (READ_BEFORE_WAIT_HINT if is_poisoned(got)
                           else diagnose(got, inputs, rank))
                if problem:
                    return Verdict(WRONG, (
                        f"on {world_size} ranks, rank {rank}, a tensor of "
                        f"{numel} {dtype} values:\n"
                        f"  this rank's input  {_show(inputs[rank])}\n"
                        f"  expected           {_show(expected(inputs))}"
                        f"\n  got                {_show(got)}\n"
                        f"Hint: {problem}"))
    return Verdict(CORRECT, f"tried world sizes {WORLD_SIZES}, tensor lengths "
                            f"{sorted({n for n, _ in CASES})} and dtypes "
                            f"{sorted({d for _, d in CASES})}.")


def diagnose_all_reduce(got, inputs, rank) -> str | None:
    expected, world_size = sum(inputs), len(inputs)
    if _same(got, expected):
        return None
    if _same(got, inputs[rank]):
        return ("the tensor did not change. Write the result into `tensor` "
                "itself (tensor[...] = ..., chunk.add_(...)): `tensor = ...` "
                "only rebinds a local name, and all_reduce works in place.")
    if got.is_floating_point() and _same(got, expected / world_size):
        return ("you averaged; all_reduce's default op is a SUM (DDP divides "
                "by the world size itself, afterwards).")
    if _same(got, expected - inputs[rank]):
        return "the sum is missing this rank's own data: add your own chunk too."
    wrong = [i for i, (g, e) in enumerate(zip(got.tensor_split(world_size),
                                              expected.tensor_split(world_size)))
             if not _same(g, e)]
    if len(wrong) < world_size:
        return (f"chunks {wrong} are wrong while the others are right: check "
                "which chunk index each rank sends and receives at each step "
                "(an index off by one?).")
    return ("no chunk is right: check the chunk indices you send and receive "
            "at each step (an index off by one?) against the ring schedule: at "
            "reduce-scatter step s rank r sends chunk (r - s) mod p and adds "
            "the chunk (r - s - 1) mod p it receives; rank r then owns chunk "
            "(r + 1) mod p, and the all-gather passes the finished chunks on.")


def diagnose_all_gather(got, inputs, rank) -> str | None:
    world_size = len(inputs)
    if not isinstance(got, (list, tuple)) or len(got) != world_size:
        return (f"return a list of {world_size} tensors, one per rank, the "
                "one from rank s at index s (like dist.all_gather).")
    if all(_same(g, e) for g, e in zip(got, inputs)):
        return None
    if not _same(got[rank], inputs[rank]) and all(
            _same(got[s], inputs[s]) for s in range(world_size) if s != rank):
        return "every slot is right but your own: put your own tensor at index rank."
    for shift in range(1, world_size):
        if all(_same(got[i], inputs[(i + shift) % world_size])
               for i in range(world_size)):
            return ("the right tensors in the wrong places: index the list by "
                    "the rank the tensor came FROM, not by the step.")
    return ("around the ring, at step s rank r receives the tensor that "
            "started on rank (r - s - 1) mod p from its left neighbour.")


def link_as_pair(fit_alpha_beta):
    """`ddp_teach.cost.fit_alpha_beta` returns a Link; the exercise returns
    (alpha, beta)."""
    def fit_pair(sizes, times, p):
        link = fit_alpha_beta(sizes, times, p, "all_reduce")
        return link.alpha, link.beta
    return fit_pair


def check_fit(fn) -> Verdict:
    sizes = np.geomspace(1e3, 1e7, 9)
    for p, alpha, beta in ((2, 2e-5, 1e-9), (4, 5e-5, 4e-10), (8, 1e-4, 2e-9)):
        times = 2 * (p - 1) * alpha + 2 * (p - 1) / p * sizes * beta
        try:
            got = fn(list(sizes), list(times), p)
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        got_alpha, got_beta = (got.alpha, got.beta) if hasattr(got, "alpha") else got
        close = lambda x, y: abs(x - y) <= 0.01 * abs(y)  # noqa: E731
        if close(got_alpha, alpha) and close(got_beta, beta):
            continue
        given = (f"on exact data from p={p}, alpha={alpha:g} s, beta={beta:g} "
                 f"s/byte you returned alpha={got_alpha:g}, beta={got_beta:g}.")
        if close(got_alpha, beta) and close(got_beta, alpha):
            return Verdict(WRONG, given + "\nHint: return (alpha, beta), in that order.")
        if close(got_beta, beta * 2 * (p - 1) / p) or close(got_alpha, alpha * 2 * (p - 1)):
            return Verdict(WRONG, given + "\nHint: the ring sends 2(p-1) messages of "
                           "n/p bytes each: t = 2(p-1) alpha + 2(p-1)/p n beta. "
                           "Fit those coefficients, not t = alpha + n beta.")
        return Verdict(WRONG, given + "\nHint: solve the least-squares problem "
                       "with columns 2(p-1) and 2(p-1)/p n (np.linalg.lstsq).")
    return Verdict(CORRECT, "recovered alpha and beta within 1% for p = 2, 4, 8.")


register(Exercise(
    "ring_allreduce", "Ring all-reduce from isend/irecv", "my_ring_allreduce",
    "ddp_teach.collectives:ring_allreduce",
    lambda fn: check_on_ranks(fn, True, sum, diagnose_all_reduce),
    ["Split the flat tensor into world_size chunks with tensor.tensor_split(p): "
     "it works even when the length is smaller than p.",
     "Phase 1 (reduce-scatter), p-1 steps: send one chunk to (rank+1) % p, "
     "receive one from (rank-1) % p and add it to your copy of that chunk.",
     "At step s rank r sends chunk (r - s) % p and receives chunk (r - s - 1) % p. "
     "Phase 2 (all-gather) is the same walk with copy instead of add, "
     "starting from chunk (r + 1) % p.",
     DEADLOCK_HINT]))
register(Exercise(
    "all_gather_p2p", "All-gather from point-to-point messages", "my_all_gather",
    "ddp_teach.collectives:ring_all_gather",
    lambda fn: check_on_ranks(fn, False, list, diagnose_all_gather),
    ["Start with a list of p slots; your own tensor goes in slot rank.",
     "Pass tensors around the ring: p-1 steps, each sending the tensor you "
     "received last to the right and receiving a new one from the left.",
     DEADLOCK_HINT]))
register(Exercise(
    "fit_alpha_beta", "Fit alpha and beta to ring all-reduce times",
    "my_fit_alpha_beta", "ddp_teach.cost:fit_alpha_beta", check_fit,
    ["The ring all-reduce time is linear in alpha and beta: "
     "t = 2(p-1) * alpha + 2(p-1)/p * n * beta.",
     "Build a matrix with one row per measurement, columns 2(p-1) and "
     "2(p-1)/p * n, and solve it with np.linalg.lstsq against the times."],
    adapt=link_as_pair))
