"""`ddp_teach.cost`: predict what a collective costs.

Why: data-parallel training spends its time in all-reduce. To reason about
gradient buckets and about overlapping communication with the backward pass,
a learner needs two things: a model that says how long a collective of n
bytes on p ranks should take, and a measurement that checks the model on the
machine at hand. This module is the model, in the units the literature
uses; `ddp_teach.bandwidth` is the measurement.

The alpha-beta model (Thakur, Rabenseifner & Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005; the ring
all-reduce: Patarasuk & Yuan, "Bandwidth Optimal All-reduce Algorithms for
Clusters of Workstations", JPDC 2009). A message costs alpha seconds plus
beta seconds per byte; reducing costs gamma seconds per byte (a, b, g
below). With p ranks, n bytes (the whole array: the all-gather's output, the
reduce-scatter's input) and lg p = ceil(log2 p), so that a non-power of two
pays for the extra round it needs:

    all_reduce      ring                2(p-1) a + 2(p-1)/p n b + (p-1)/p n g
                    recursive_doubling  lg p (a + n b + n g)
                    rabenseifner        2 lg p a + 2(p-1)/p n b + (p-1)/p n g
                    tree                2 lg p (a + n b) + lg p n g
    all_gather      ring                (p-1) a + (p-1)/p n b
    reduce_scatter  ring                (p-1) a + (p-1)/p n (b + g)
                    recursive_halving   lg p a + (p-1)/p n (b + g)
    broadcast       binomial            lg p (a + n b)

The tree all-reduce is Thakur et al.'s reduce followed by a broadcast, both
on a binomial tree.

Bandwidth as nccl-tests reports it (its doc/PERFORMANCE.md): algbw = S / t
for an array of S bytes; busbw = algbw x a factor per op that makes the number
comparable with the link's bandwidth whatever the number of ranks: it equals
1/beta for a ring algorithm with no latency. `ddp_teach.bandwidth.sweep`
measures these on real ranks and `fit_alpha_beta` fits the model to the
measurement.

Where it sits: notebook 01 teaches this model, but the module is a neutral
one, not a lesson's implementation: formulas and a fit, importing nothing
from ddp_teach (only math and numpy), running nothing on ranks. So the
simulator (`ddp_teach.sim`: `hardware.Link`, `predict`, `simulation`) may
build on it, as it may on `ddp_teach.buckets`, while it imports no module
that implements a lesson (ddp, zero, fsdp, ...); tests/test_package.py holds
both rules. Moving it under sim/ would make notebook 01's model look like
simulator machinery, and make the course import the simulator for a formula.
"""
import math
from dataclasses import dataclass

import numpy as np

GB = 1e9  # nccl-tests' GB/s are 10^9 bytes per second

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}

# Coefficients (of alpha, of n*beta, of n*gamma) as functions of p and lg p.
MODELS = {
    "all_reduce": {
        "ring": lambda p, lg: (2 * (p - 1), 2 * (p - 1) / p, (p - 1) / p),
        "tree": lambda p, lg: (2 * lg, 2 * lg, lg),
        "recursive_doubling": lambda p, lg: (lg, lg, lg),
        "rabenseifner": lambda p, lg: (2 * lg, 2 * (p - 1) / p, (p - 1) / p),
    },
    "all_gather": {"ring": lambda p, lg: (p - 1, (p - 1) / p, 0.0)},
    "reduce_scatter": {
        "ring": lambda p, lg: (p - 1, (p - 1) / p, (p - 1) / p),
        "recursive_halving": lambda p, lg: (lg, (p - 1) / p, (p - 1) / p),
    },
    "broadcast": {"binomial": lambda p, lg: (lg, lg, 0.0)},
    # one message from one rank to another (send / recv): p is 2
    "send_recv": {"direct": lambda p, lg: (1, 1, 0.0)},
}
DEFAULT_ALGORITHM = {"all_reduce": "ring", "all_gather": "ring",
                     "reduce_scatter": "ring", "broadcast": "binomial",
                     "send_recv": "direct"}


@dataclass(frozen=True)
class Link:
    """alpha: seconds per message; beta: seconds per byte; gamma: seconds per
    byte reduced."""
    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Link.{name} must be a finite number >= 0 "
                                 f"(seconds); got {value!r}")

    @classmethod
    def from_latency_bandwidth(cls, latency_s: float,
                               bandwidth_bytes_per_s: float,
                               gamma: float = 0.0) -> "Link":
        """Link.from_latency_bandwidth(5e-6, 10e9): 5 µs, 10 GB/s."""
        if not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s; got "
                             f"{bandwidth_bytes_per_s!r}")
        return cls(latency_s, 1.0 / bandwidth_bytes_per_s, gamma)

    @property
    def bandwidth(self) -> float:
        """Bytes per second (1/beta)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


def _check_op(op: str, known) -> None:
    if op not in known:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(known)}")


def _check_ranks(name: str, p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"{name} (number of ranks) must be an int >= 1; "
                         f"got {p!r}")


def _coefficients(op: str, p: int, algorithm: str | None) -> tuple:
    _check_op(op, MODELS)
    algorithm = DEFAULT_ALGORITHM[op] if algorithm is None else algorithm
    if algorithm not in MODELS[op]:
        raise ValueError(f"unknown {op} algorithm {algorithm!r}; valid: "
                         f"{', '.join(MODELS[op])}")
    _check_ranks("p", p)
    return MODELS[op][algorithm](p, (p - 1).bit_length())  # ceil(log2 p)


def collective_time(op: str, nbytes: float, p: int, link: Link,
                    algorithm: str | None = None) -> float:
    """Seconds the alpha-beta model predicts for `op` on `nbytes` and `p`
    ranks (`algorithm` None: ring, or binomial for broadcast)."""
    latency, bandwidth, reduction = _coefficients(op, p, algorithm)
    if not (nbytes >= 0 and math.isfinite(nbytes)):
        raise ValueError(f"nbytes must be a finite number >= 0; got {nbytes!r}")
    return (latency * link.alpha + bandwidth * nbytes * link.beta
            + reduction * nbytes * link.gamma)


def allreduce_time(nbytes, p, link, algorithm="ring") -> float:
    return collective_time("all_reduce", nbytes, p, link, algorithm)


def allgather_time(nbytes, p, link, algorithm="ring") -> float:
    return collective_time("all_gather", nbytes, p, link, algorithm)


def reduce_scatter_time(nbytes, p, link, algorithm="ring") -> float:
    return collective_time("reduce_scatter", nbytes, p, link, algorithm)


def broadcast_time(nbytes, p, link, algorithm="binomial") -> float:
    return collective_time("broadcast", nbytes, p, link, algorithm)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algbw to busbw for `op` on `n` ranks."""
    _check_op(op, BUSBW_FACTOR)
    _check_ranks("n", n)
    return BUSBW_FACTOR[op](n)


def algbw(nbytes: float, seconds: float) -> float:
    """Bytes per second: the array's size over the time (nccl-tests' S/t)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0; got {seconds!r}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0; got {nbytes!r}")
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bytes per second comparable with the link's bandwidth (nccl-tests)."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)


def fit_alpha_beta(sizes, times, p: int = 2, op: str = "all_reduce") -> Link:
    """The Link whose ring model (binomial for broadcast) best fits measured
    (bytes, seconds) pairs on p ranks.

    Fits t = A alpha + n B beta, with A and B the model's coefficients, by
    least squares on the relative error (so that small messages, which set
    alpha, count as much as large ones, which set beta), keeping both
    non-negative. Reduction is not fitted: gamma is folded into beta (for the
    ring all-reduce the fitted beta is beta + gamma / 2), and gamma is 0.
    """
    latency, bandwidth, _ = _coefficients(op, p, None)
    if p < 2:
        raise ValueError("fitting needs p >= 2: one rank sends nothing")
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    if sizes.shape != times.shape or sizes.ndim != 1:
        raise ValueError("sizes and times must be two 1-D sequences of the "
                         "same length")
    if len(np.unique(sizes)) < 2 or np.any(sizes < 0) or np.any(times <= 0):
        raise ValueError("need sizes >= 0 with at least two different values, "
                         "and times > 0")
    design = np.column_stack([np.full_like(sizes, latency), sizes * bandwidth])
    design, target = design / times[:, None], np.ones_like(times)
    # Non-negative least squares on two unknowns: the best feasible one of the
    # free fit and the two fits of one unknown (which are never negative).
    candidates = [np.linalg.lstsq(design, target, rcond=None)[0]]
    for column in (0, 1):
        x, values = np.zeros(2), design[:, column]
        x[column] = values @ target / (values @ values)
        candidates.append(x)
    feasible = [x for x in candidates if np.all(x >= 0)]
    alpha, beta = min(feasible, key=lambda x: np.sum((design @ x - target) ** 2))
    return Link(float(alpha), float(beta))
