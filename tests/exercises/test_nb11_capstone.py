"""Notebook 11's planted mistakes (PLANTED, run by test_registry.py, which
also checks the reference and the stub): each must get the hint that fits.
The likely mistakes are planted once each; the last ones break a property
in a way no listed mistake does, so the checker's probes must name the
property. Below: the checker's mistakes are told apart from each other and
from the reference, and the formula it wants is the simulator's charge."""
import math

import numpy as np
import pytest

import ddp_teach as dt
from ddp_teach.exercises import nb11_capstone, reference_solution
from ddp_teach.sim.model.hardware import LINKS


def ring(world_size):
    return 2 * (world_size - 1), 2 * (world_size - 1) / world_size


def allreduce(nbytes, world_size, link):
    steps, share = ring(world_size)
    return steps * link.alpha + share * nbytes * link.beta


def compute_only(compute_s, nbytes, world_size, link):
    return compute_s


def communication_only(compute_s, nbytes, world_size, link):
    return allreduce(nbytes, world_size, link)


def overlapped(compute_s, nbytes, world_size, link):
    """As if the all-reduce ran during backward: max instead of a sum."""
    return max(compute_s, allreduce(nbytes, world_size, link))


def compute_split_over_ranks(compute_s, nbytes, world_size, link):
    return compute_s / world_size + allreduce(nbytes, world_size, link)


def no_latency(compute_s, nbytes, world_size, link):
    return compute_s + ring(world_size)[1] * nbytes * link.beta


def latency_once(compute_s, nbytes, world_size, link):
    return compute_s + link.alpha + ring(world_size)[1] * nbytes * link.beta


def no_bandwidth(compute_s, nbytes, world_size, link):
    return compute_s + ring(world_size)[0] * link.alpha


def whole_buffer_every_step(compute_s, nbytes, world_size, link):
    steps, _ = ring(world_size)
    return compute_s + steps * (link.alpha + nbytes * link.beta)


def twice_the_buffer(compute_s, nbytes, world_size, link):
    return compute_s + ring(world_size)[0] * link.alpha + 2 * nbytes * link.beta


def divided_by_n_twice(compute_s, nbytes, world_size, link):
    return compute_s + allreduce(nbytes / world_size, world_size, link)


def two_n_steps(compute_s, nbytes, world_size, link):
    return compute_s + 2 * world_size * link.alpha + 2 * nbytes * link.beta


def reduce_scatter_only(compute_s, nbytes, world_size, link):
    n = world_size
    return compute_s + (n - 1) * link.alpha + (n - 1) / n * nbytes * link.beta


def tree_latency(compute_s, nbytes, world_size, link):
    steps = 2 * math.ceil(math.log2(world_size))
    return compute_s + steps * link.alpha + ring(world_size)[1] * nbytes * link.beta


def bits_for_bytes(compute_s, nbytes, world_size, link):
    return compute_s + allreduce(8 * nbytes, world_size, link)


def bytes_to_bits_backwards(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return compute_s + steps * link.alpha + share * nbytes * link.beta / 8


def bandwidth_multiplied(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return compute_s + steps * link.alpha + share * nbytes * link.bandwidth


def in_milliseconds(compute_s, nbytes, world_size, link):
    return 1e3 * (compute_s + allreduce(nbytes, world_size, link))


def in_microseconds(compute_s, nbytes, world_size, link):
    return 1e6 * (compute_s + allreduce(nbytes, world_size, link))


def infiniband_hard_coded(compute_s, nbytes, world_size, link):
    return compute_s + allreduce(nbytes, world_size, dt.sim.LINKS["InfiniBand NDR"])


def the_notebooks_64_gpus(compute_s, nbytes, world_size, link):
    return compute_s + allreduce(nbytes, 64, link)


def a_constant(compute_s, nbytes, world_size, link):
    return 2.07e-3


def as_a_tensor(compute_s, nbytes, world_size, link):
    import torch
    return torch.tensor(compute_s)


# properties broken in ways that are none of the listed mistakes: the probes
def one_gpu_pays_a_message(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return compute_s + max(steps, 1) * link.alpha + share * nbytes * link.beta


def compute_counted_twice(compute_s, nbytes, world_size, link):
    return 2 * compute_s + allreduce(nbytes, world_size, link)


def reduce_scatter_without_latency(compute_s, nbytes, world_size, link):
    return compute_s + (world_size - 1) / world_size * nbytes * link.beta


def bytes_off_by_half(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return compute_s + steps * link.alpha + 1.5 * share * nbytes * link.beta


def wrong_for_large_rings(compute_s, nbytes, world_size, link):
    extra = link.alpha if world_size > 100 else 0.0
    return compute_s + allreduce(nbytes, world_size, link) + extra


def fails_off_the_cases(compute_s, nbytes, world_size, link):
    if compute_s not in (1e-3, 0.2):
        raise ValueError("only the cases I tried")
    return 1.01 * (compute_s + allreduce(nbytes, world_size, link))


def bytes_hidden_behind_the_compute(compute_s, nbytes, world_size, link):
    """Assumes overlap: the transfer hidden behind the compute, only the
    latency added (issue 34: once told to look for "a branch")."""
    steps, share = ring(world_size)
    return max(compute_s, share * nbytes * link.beta) + steps * link.alpha


def by_bandwidth_with_an_early_return(compute_s, nbytes, world_size, link):
    """Right, in another style: one GPU returned early, bytes over bandwidth."""
    if world_size == 1:
        return compute_s
    per_message = nbytes / world_size
    return compute_s + 2 * (world_size - 1) * (link.alpha + per_message / link.bandwidth)


def test_step_time_in_another_style_passes(verdict):
    passed, seen = verdict("step_time", by_bandwidth_with_an_early_return)
    assert passed, seen


PLANTED = [
    ("step_time", compute_only, "the communication is missing"),
    ("step_time", communication_only, "the compute is missing"),
    ("step_time", overlapped, "nothing overlaps here"),
    ("step_time", compute_split_over_ranks, "do not divide it by N"),
    ("step_time", no_latency, "the latency term is missing"),
    ("step_time", latency_once, "alpha is paid by every message, not once"),
    ("step_time", no_bandwidth, "the bandwidth term is missing"),
    ("step_time", whole_buffer_every_step, "one N-th of the buffer"),
    ("step_time", twice_the_buffer, "not 2 x nbytes"),
    ("step_time", divided_by_n_twice, "You divided by N twice"),
    ("step_time", two_n_steps, "not 2N"),
    ("step_time", reduce_scatter_only, "a reduce-scatter alone"),
    ("step_time", tree_latency, "a tree's latency"),
    ("step_time", bits_for_bytes, "no factor 8 (bits)"),
    ("step_time", bytes_to_bits_backwards, "no division by 8"),
    ("step_time", bandwidth_multiplied, "not multiplied"),
    ("step_time", in_milliseconds, "yours is in milliseconds"),
    ("step_time", in_microseconds, "yours is in microseconds"),
    ("step_time", infiniband_hard_coded, "right for the InfiniBand NDR link only"),
    ("step_time", the_notebooks_64_gpus, "right for 64 GPUs only: use world_size"),
    ("step_time", a_constant, "whatever it is given"),
    ("step_time", as_a_tensor, "a float"),
    ("step_time", one_gpu_pays_a_message, "with one GPU"),
    ("step_time", compute_counted_twice, ("one second more of compute",
                                          "grows by 2 s")),
    ("step_time", reduce_scatter_without_latency, ("nbytes=0 and compute_s=0",
                                                   "126 messages")),
    ("step_time", bytes_off_by_half, "the bytes: 2.5e+07 bytes on 64 GPUs"),
    ("step_time", wrong_for_large_rings, "look for a branch"),
    ("step_time", fails_off_the_cases, nb11_capstone.FORMULA),
    ("step_time", bytes_hidden_behind_the_compute,
     ("lets the compute overlap the all-reduce", "PLUS")),
]


def answers_of(step_time):
    return [step_time(c, b, n, LINKS[name]) for c, b, n, name in nb11_capstone.CASES]


def test_each_listed_mistake_is_told_apart_from_the_others_and_the_reference():
    """A hint names a mistake only when every answer is that mistake's:
    no two mistakes, and no mistake and the reference, may agree on all
    the cases, or a hint would name the wrong one."""
    reference = answers_of(reference_solution("step_time"))
    seen = [reference]
    for hint, mistake in nb11_capstone.MISTAKES:
        answers = answers_of(mistake)
        for other in seen:
            assert not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)
                           for a, b in zip(answers, other)), hint
        seen.append(answers)


@pytest.mark.parametrize("kind", [float, np.float64, np.float32])
def test_any_real_number_type_is_accepted(kind, verdict):
    reference = reference_solution("step_time")
    passed, seen = verdict("step_time", lambda c, b, n, link: kind(reference(c, b, n, link)))
    assert passed, seen


def test_the_checked_links_charge_no_reduction_so_the_exercise_text_holds():
    """The exercise names link.alpha and link.beta only: the reference's
    gamma term (seconds per byte reduced) must be 0 on the checked links."""
    assert all(LINKS[name].gamma == 0 for name in nb11_capstone.CHECKED_LINKS)


def test_the_reference_is_the_ring_charge_the_simulator_makes():
    """The 64-GPU row of notebook 11: 126 messages on InfiniBand NDR and the
    bytes of the gradients, after the compute; one GPU: the compute alone."""
    step_time = reference_solution("step_time")
    link = dt.sim.LINKS["InfiniBand NDR"]
    compute_s, nbytes = 1.064e-3, 467_336
    want = compute_s + 126 * link.alpha + 126 / 64 * nbytes * link.beta
    assert math.isclose(step_time(compute_s, nbytes, 64, link), want, rel_tol=1e-12)
    assert step_time(compute_s, nbytes, 1, link) == compute_s
