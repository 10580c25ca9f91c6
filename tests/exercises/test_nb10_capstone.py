"""Notebook 10's planted mistakes (PLANTED, run by test_registry.py, which
also checks the reference and the stub): each must get the hint that fits;
and the formula the checker wants is the simulator's charge."""
import ddp_teach as dt
from ddp_teach.exercises import reference_solution


def ring(world_size):
    return 2 * (world_size - 1), 2 * (world_size - 1) / world_size


def compute_only(compute_s, nbytes, world_size, link):
    return compute_s


def communication_only(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return steps * link.alpha + share * nbytes * link.beta


def no_latency(compute_s, nbytes, world_size, link):
    return compute_s + ring(world_size)[1] * nbytes * link.beta


def no_bandwidth(compute_s, nbytes, world_size, link):
    return compute_s + ring(world_size)[0] * link.alpha


def whole_buffer_every_step(compute_s, nbytes, world_size, link):
    steps, _ = ring(world_size)
    return compute_s + steps * (link.alpha + nbytes * link.beta)


def two_n_steps(compute_s, nbytes, world_size, link):
    return compute_s + 2 * world_size * link.alpha + 2 * nbytes * link.beta


def overlapped(compute_s, nbytes, world_size, link):
    """As if the all-reduce ran during backward: max instead of a sum."""
    steps, share = ring(world_size)
    return max(compute_s, steps * link.alpha + share * nbytes * link.beta)


def off_by_a_factor(compute_s, nbytes, world_size, link):
    steps, share = ring(world_size)
    return compute_s + steps * link.alpha + share * nbytes * link.beta / 8  # bits?


def as_a_tensor(compute_s, nbytes, world_size, link):
    import torch
    return torch.tensor(compute_s)


PLANTED = [
    ("step_time", compute_only, "the communication is missing"),
    ("step_time", communication_only, "the compute is missing"),
    ("step_time", no_latency, "the latency term is missing"),
    ("step_time", no_bandwidth, "the bandwidth term is missing"),
    ("step_time", whole_buffer_every_step, "one N-th of the buffer"),
    ("step_time", two_n_steps, "not 2N"),
    ("step_time", overlapped, "nothing overlaps here"),
    ("step_time", off_by_a_factor, "t = compute_s + 2(N-1) alpha"),
    ("step_time", as_a_tensor, "a float"),
]


def test_the_reference_is_what_the_simulator_charged_in_the_notebook():
    """Notebook 10's 64-GPU row: 1.044 ms of compute, 467,336 bytes of
    gradients on InfiniBand NDR; the simulator's all-reduce took 1.026 ms."""
    step_time = reference_solution("step_time")
    link = dt.sim.LINKS["InfiniBand NDR"]
    assert abs(step_time(1.044e-3, 467_336, 64, link) - 2.070e-3) < 2e-6
    assert step_time(1.044e-3, 467_336, 1, link) == 1.044e-3
