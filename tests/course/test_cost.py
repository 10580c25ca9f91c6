"""`ddp_teach.cost`: the alpha-beta model, nccl-tests' algbw / busbw and
the fit (the sweep that measures them: test_bandwidth.py)."""
import re

import numpy as np
import pytest

from ddp_teach import cost
from ddp_teach.cost import Link

LINK = Link(alpha=1e-5, beta=1e-9, gamma=1e-10)


@pytest.mark.parametrize("n", range(2, 65))
def test_busbw_factors_match_nccl_tests(n):
    expected = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n,
                "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0}
    assert set(cost.BUSBW_FACTOR) == set(expected)
    for op, factor in expected.items():
        assert cost.busbw_factor(op, n) == pytest.approx(factor, rel=1e-12)
        assert cost.busbw(op, 1e6, 1e-3, n) == pytest.approx(1e9 * factor)


def test_algbw_is_bytes_over_seconds():
    assert cost.algbw(4e6, 2e-3) == pytest.approx(2e9)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 13, 64])
@pytest.mark.parametrize("nbytes", [1e3, 1e6, 3e8])
def test_ring_busbw_equals_link_bandwidth_without_latency(p, nbytes):
    link = Link(alpha=0.0, beta=1 / 12.5e9)
    for op, time in [("all_reduce", cost.allreduce_time),
                     ("all_gather", cost.allgather_time),
                     ("reduce_scatter", cost.reduce_scatter_time)]:
        seconds = time(nbytes, p, link)
        assert cost.busbw(op, nbytes, seconds, p) == pytest.approx(12.5e9, rel=1e-12)
        assert link.bandwidth == pytest.approx(12.5e9)


# Hand-computed for p=4 (lg p = 2), n=1e6, alpha=1e-5, beta=1e-9, gamma=1e-10.
@pytest.mark.parametrize("time, algorithm, expected", [
    (cost.allreduce_time, "ring", 6e-5 + 1.5e-3 + 7.5e-5),
    (cost.allreduce_time, "recursive_doubling", 2 * (1e-5 + 1e-3 + 1e-4)),
    (cost.allreduce_time, "rabenseifner", 4e-5 + 1.5e-3 + 7.5e-5),
    (cost.allreduce_time, "tree", 4 * (1e-5 + 1e-3) + 2e-4),
    (cost.allgather_time, "ring", 3e-5 + 7.5e-4),
    (cost.reduce_scatter_time, "ring", 3e-5 + 7.5e-4 + 7.5e-5),
    (cost.reduce_scatter_time, "recursive_halving", 2e-5 + 7.5e-4 + 7.5e-5),
    (cost.broadcast_time, "binomial", 2 * (1e-5 + 1e-3)),
])
def test_formulas_against_hand_computed_values(time, algorithm, expected):
    assert time(1e6, 4, LINK, algorithm=algorithm) == pytest.approx(expected,
                                                                    rel=1e-12)
    assert time(1e6, 1, LINK, algorithm=algorithm) == 0.0


def test_lg_p_rounds_up_for_non_powers_of_two():
    # p=5 needs ceil(log2 5) = 3 rounds, as p=8 does; p=4 needs 2
    assert cost.broadcast_time(1e6, 5, LINK) == pytest.approx(3 * (1e-5 + 1e-3))
    assert cost.broadcast_time(1e6, 5, LINK) == cost.broadcast_time(1e6, 8, LINK)
    assert cost.broadcast_time(1e6, 4, LINK) < cost.broadcast_time(1e6, 5, LINK)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 16, 64])
def test_ring_all_reduce_is_reduce_scatter_then_all_gather(p):
    assert cost.allreduce_time(1e6, p, LINK) == pytest.approx(
        cost.reduce_scatter_time(1e6, p, LINK) + cost.allgather_time(1e6, p, LINK))


def test_identities_between_algorithms():
    # on 2 ranks Rabenseifner's algorithm is the ring
    assert cost.allreduce_time(1e6, 2, LINK, "rabenseifner") == pytest.approx(
        cost.allreduce_time(1e6, 2, LINK, "ring"))
    # on 2 ranks with only bandwidth, recursive doubling sends what the ring does
    bandwidth_only = Link(alpha=0.0, beta=1e-9)
    assert cost.allreduce_time(1e6, 2, bandwidth_only, "recursive_doubling") == \
        pytest.approx(cost.allreduce_time(1e6, 2, bandwidth_only, "ring"))


@pytest.mark.parametrize("p", range(2, 65))
def test_rabenseifner_has_ring_bandwidth_and_fewer_latency_terms(p):
    no_latency = Link(alpha=0.0, beta=1e-9, gamma=1e-10)
    assert cost.allreduce_time(1e6, p, no_latency, "rabenseifner") == \
        pytest.approx(cost.allreduce_time(1e6, p, no_latency, "ring"), rel=1e-12)
    latency_only = Link(alpha=1e-5, beta=0.0)
    rabenseifner = cost.allreduce_time(1e6, p, latency_only, "rabenseifner")
    ring = cost.allreduce_time(1e6, p, latency_only, "ring")
    if p > 4:
        assert rabenseifner < ring
    if p == 2:
        assert rabenseifner == ring


def test_link_from_latency_and_bandwidth():
    link = Link.from_latency_bandwidth(5e-6, 10e9, gamma=1e-11)
    assert link == Link(5e-6, 1e-10, 1e-11)
    assert link.bandwidth == pytest.approx(10e9)


SIZES = np.geomspace(1e3, 1e8, 16)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter",
                                "broadcast"])
@pytest.mark.parametrize("p", [2, 4, 6])
def test_fit_recovers_alpha_and_beta_from_exact_data(op, p):
    truth = Link(alpha=2e-5, beta=1 / 3e9)
    times = [cost.collective_time(op, n, p, truth) for n in SIZES]
    fitted = cost.fit_alpha_beta(SIZES, times, p=p, op=op)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-9)
    assert fitted.beta == pytest.approx(truth.beta, rel=1e-9)
    assert fitted.gamma == 0.0


def test_fit_tolerates_five_percent_noise():
    truth = Link(alpha=2e-5, beta=1 / 3e9)
    rng = np.random.default_rng(0)
    sizes = np.repeat(SIZES, 3)
    times = [cost.allreduce_time(n, 4, truth) * (1 + 0.05 * rng.standard_normal())
             for n in sizes]
    fitted = cost.fit_alpha_beta(sizes, times, p=4)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=0.1)
    assert fitted.beta == pytest.approx(truth.beta, rel=0.1)


def test_fit_never_returns_negative_alpha_or_beta():
    # times that a free fit would explain with a negative alpha ...
    sizes = [1e5, 1e6]
    fitted = cost.fit_alpha_beta(sizes, [n * 1e-9 - 1e-5 for n in sizes])
    assert fitted.alpha == 0.0 and fitted.beta > 0
    # ... and with a negative beta (bigger messages faster)
    fitted = cost.fit_alpha_beta(sizes, [1e-3, 5e-4])
    assert fitted.beta == 0.0 and fitted.alpha > 0


@pytest.mark.parametrize("call, message", [
    (lambda: cost.allreduce_time(1e6, 0, LINK), "p (number of ranks)"),
    (lambda: cost.allreduce_time(1e6, 2.0, LINK), "p (number of ranks)"),
    (lambda: cost.allgather_time(-1, 2, LINK), "nbytes"),
    (lambda: cost.allreduce_time(1e6, 4, LINK, "butterfly"),
     "valid: ring, tree, recursive_doubling, rabenseifner"),
    (lambda: cost.reduce_scatter_time(1e6, 4, LINK, "tree"),
     "valid: ring, recursive_halving"),
    (lambda: cost.collective_time("allreduce", 1e6, 4, LINK), "unknown op"),
    (lambda: cost.busbw_factor("allreduce", 4), "all_reduce"),
    (lambda: cost.busbw_factor("all_reduce", 0), "n (number of ranks)"),
    (lambda: cost.algbw(1e6, 0.0), "seconds"),
    (lambda: Link(alpha=-1e-6, beta=1e-9), "alpha"),
    (lambda: Link.from_latency_bandwidth(1e-6, 0), "bandwidth"),
    (lambda: cost.fit_alpha_beta([1e3, 1e6], [1e-4]), "same length"),
    (lambda: cost.fit_alpha_beta([1e3, 1e3], [1e-4, 1e-4]), "two different"),
    (lambda: cost.fit_alpha_beta([1e3, 1e6], [1e-4, 0.0]), "times > 0"),
    (lambda: cost.fit_alpha_beta([1e3, 1e6], [1e-4, 1e-3], p=1), "p >= 2"),
])
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
