"""The checker for appendix A1's exercise (A1_cost_models.ipynb): fit the
alpha-beta model of a ring all-reduce, t = 2(p-1) alpha + 2(p-1)/p n beta,
to measured times.

What the reference (`cost.fit_alpha_beta`, adapted to return the pair)
guarantees, and how each property is checked (here in the kernel: the fit
is plain arithmetic):

- exact data from known alpha and beta gives them back (within 1%), from
  two measurements (the smallest case, shown whole in a verdict) and
  from nine, for p = 2, 4 and 8: the ring's coefficients, with the p
  given;
- it returns the pair (alpha, beta), in that order, in seconds and seconds
  per byte;
- it fits the relative error: on times with a few percent of noise it
  finds the same alpha and beta as least squares with each measurement
  divided by its time (within 0.1%: the same problem, solved in another
  order of floating-point operations), so that small messages, which set
  alpha, count as much as large ones, which set beta; three measurements
  first (the fewest on which weightings differ), then nine;
- lists are accepted, not only numpy arrays (the checker passes lists).

The course's fit also keeps alpha and beta non-negative (a measurement
cannot have a negative latency); the exercise does not ask for that, so no
case here makes the free fit negative. No ranks, tensors, hash seeds or
empty inputs enter this exercise.

Wrong answers are matched with the mistakes they look like: the pair
reversed, t = alpha + n beta fitted, p ignored (fitted as for 2 ranks),
microseconds returned, numpy's whole lstsq result returned, an unweighted
fit, a fit weighted by the time squared or by its square root, so that the
hint names the mistake actually made (a fit weighted otherwise is told the
rule, not "unweighted").
"""
import numpy as np

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE, WRONG,
                                         Exercise, Verdict, register)

SIZES = np.geomspace(1e3, 1e7, 9)
# (p, alpha, beta, which of SIZES are measured), smallest first: two
# measurements (the fewest that fix two unknowns; 1 kB and 10 MB, a table
# a learner can check by hand), then all nine, on 2, 4 and 8 ranks
EXACT_CASES = ((2, 2e-5, 1e-9, [0, 8]), (2, 2e-5, 1e-9, range(9)),
               (4, 5e-5, 4e-10, range(9)), (8, 1e-4, 2e-9, range(9)))
# a few percent up or down per measurement, fixed so that the check repeats
NOISE = np.array([1.04, 0.97, 1.03, 0.96, 1.02, 0.98, 1.05, 0.95, 1.01])
# noisy times: three measurements (1 kB, 100 kB, 10 MB: the fewest on which
# weightings give different fits), then all nine
NOISY_CASES = ((4, 5e-5, 4e-10, [0, 4, 8]), (4, 5e-5, 4e-10, range(9)))
EXACT_RTOL, NOISY_RTOL = 0.01, 1e-3


def ring_times(p: int, alpha: float, beta: float, sizes=SIZES) -> np.ndarray:
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * np.asarray(sizes) * beta


def _table(sizes, times) -> str:
    """The measurements of a case, for a verdict: "n = [1000, 1e+07] bytes,
    t = [4.1e-05, 0.01] s" (the full list only when it is short)."""
    if len(sizes) > 3:
        return f"{len(sizes)} sizes from {sizes[0]:g} to {sizes[-1]:g} bytes"
    return (f"n = [{', '.join(f'{n:g}' for n in sizes)}] bytes, t = "
            f"[{', '.join(f'{t:.4g}' for t in times)}] s")


def link_as_pair(fit_alpha_beta):
    """`ddp_teach.cost.fit_alpha_beta` returns a Link; the exercise returns
    (alpha, beta)."""
    def fit_pair(sizes, times, p):
        link = fit_alpha_beta(sizes, times, p, "all_reduce")
        return link.alpha, link.beta
    return fit_pair


def _pair(returned):
    """(alpha, beta) as floats from what the learner returned, or a
    sentence saying why it is not a pair of numbers."""
    if hasattr(returned, "alpha") and hasattr(returned, "beta"):
        returned = (returned.alpha, returned.beta)
    try:
        values = [float(v) for v in np.asarray(returned, dtype=object).ravel()]
    except (TypeError, ValueError):
        values = None
    if values is not None and len(values) == 2:
        return tuple(values)
    if isinstance(returned, tuple) and len(returned) == 4:
        return ("a tuple of 4: np.linalg.lstsq's whole result? Its first "
                "element is the solution: return float(x[0]), float(x[1]) of it.")
    return f"{returned!r:.100}: return the pair (alpha, beta), two numbers."


def _fit_hint(got, p, alpha, beta) -> str:
    close = lambda x, y: abs(x - y) <= EXACT_RTOL * abs(y)  # noqa: E731
    got_alpha, got_beta = got
    if close(got_alpha, beta) and close(got_beta, alpha):
        return "return (alpha, beta), in that order."
    if close(got_alpha, alpha * 1e6) or close(got_beta, beta * 1e6):
        return ("return seconds (and seconds per byte), not microseconds: the "
                "times are given in seconds.")
    if close(got_alpha, alpha * (p - 1)) and close(got_beta, beta * 2 * (p - 1) / p):
        return ("that is the fit for 2 ranks: use the p you are given in both "
                "columns, 2(p-1) and 2(p-1)/p n.")
    if close(got_beta, beta * 2 * (p - 1) / p) or close(got_alpha, alpha * 2 * (p - 1)):
        return ("the ring sends 2(p-1) messages of n/p bytes each: t = 2(p-1) "
                "alpha + 2(p-1)/p n beta. Fit those coefficients, not t = alpha "
                "+ n beta.")
    return ("solve the least-squares problem with columns 2(p-1) and 2(p-1)/p n "
            "(np.linalg.lstsq).")


def _call(fn, sizes, times, p):
    """The learner's pair for these times, or a Verdict to return."""
    try:
        returned = fn(list(sizes), list(times), p)
    except NotImplementedError:
        return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    got = _pair(returned)
    if isinstance(got, str):
        return Verdict(WRONG, f"on p={p} you returned {got}")
    return got


def check_fit(fn) -> Verdict:
    """The cases smallest first; the verdict shows the first that fails,
    with its measurements when they are few enough to read."""
    for p, alpha, beta, measured in EXACT_CASES:
        sizes = SIZES[list(measured)]
        times = ring_times(p, alpha, beta, sizes)
        got = _call(fn, sizes, times, p)
        if isinstance(got, Verdict):
            return got
        if all(abs(g - w) <= EXACT_RTOL * w for g, w in zip(got, (alpha, beta))):
            continue
        return Verdict(WRONG, f"on exact data from p={p}, alpha={alpha:g} s, "
                       f"beta={beta:g} s/byte ({_table(sizes, times)}): "
                       f"expected alpha={alpha:g}, beta={beta:g}, you returned "
                       f"alpha={got[0]:g}, beta={got[1]:g}.\nHint: "
                       f"{_fit_hint(got, p, alpha, beta)}")
    for p, alpha, beta, measured in NOISY_CASES:
        sizes = SIZES[list(measured)]
        times = ring_times(p, alpha, beta, sizes) * NOISE[list(measured)]
        want = link_as_pair(_reference())(sizes, times, p)
        got = _call(fn, sizes, times, p)
        if isinstance(got, Verdict):
            return got
        if not all(abs(g - w) <= NOISY_RTOL * w for g, w in zip(got, want)):
            return Verdict(WRONG, (
                f"exact data is fitted, but on times with a few percent of "
                f"noise (p={p}, {_table(sizes, times)}) you returned "
                f"alpha={got[0]:.4g}, beta={got[1]:.4g}; the least-squares "
                f"fit of the relative error gives alpha={want[0]:.4g}, "
                f"beta={want[1]:.4g}.\nHint: "
                + _weighting_hint(got, sizes, times, p)))
    return Verdict(CORRECT, "recovered alpha and beta within 1% for p = 2, 4, 8 "
                            "from 2 and 9 measurements, and fitted noisy times "
                            "(3 and 9 measurements) on their relative error.")


WEIGHTINGS = [  # (power of the time each row is divided by, the hint)
    (0, "an unweighted fit lets the largest messages, whose times are "
        "largest, decide alpha too. Divide each row of the matrix and its "
        "time by that time, and solve against a vector of ones."),
    (2, "each row was divided by its time squared (or divided twice): the "
        "smallest messages then outweigh the rest. Divide each row and its "
        "time by the time once: the residuals are then relative errors."),
    (0.5, "each row was divided by the square root of its time: halfway "
          "between no weighting and the relative error. Divide each row and "
          "its time by the time itself."),
]


def weighted_fit(sizes, times, p, power) -> tuple:
    """Least squares with each row and its time divided by time ** power."""
    sizes = np.asarray(sizes, float)
    design = np.column_stack([np.full(len(sizes), 2.0 * (p - 1)),
                              2.0 * (p - 1) / p * sizes])
    weight = 1.0 / np.asarray(times) ** power
    solution = np.linalg.lstsq(design * weight[:, None], times * weight,
                               rcond=None)[0]
    return tuple(solution)


def _weighting_hint(got, sizes, times, p) -> str:
    """The weighting that `got` is the fit of, named; or the general rule."""
    for power, hint in WEIGHTINGS:
        fitted = weighted_fit(sizes, times, p, power)
        if all(abs(g - f) <= NOISY_RTOL * abs(f) for g, f in zip(got, fitted)):
            return hint
    return ("fit the relative error: divide each row of the matrix and its "
            "time by that time (once), and solve against a vector of ones; "
            "then return (alpha, beta) from the solution, unchanged.")


def _reference():
    from ddp_teach.cost import fit_alpha_beta
    return fit_alpha_beta


register(Exercise(
    "fit_alpha_beta", "Fit alpha and beta to ring all-reduce times",
    "my_fit_alpha_beta", "ddp_teach.cost:fit_alpha_beta", check_fit,
    ["The ring all-reduce time is linear in alpha and beta: "
     "t = 2(p-1) * alpha + 2(p-1)/p * n * beta.",
     "Build a matrix with one row per measurement, columns 2(p-1) and "
     "2(p-1)/p * n, and solve it with np.linalg.lstsq against the times.",
     "To fit the relative error, divide each row and its time by that time "
     "first (the right-hand side becomes a vector of ones)."],
    adapt=link_as_pair))
