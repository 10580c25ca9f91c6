"""Checker for notebook 10's exercise: the step time of DDP on N GPUs,
predicted with the alpha-beta model before the simulator gives it.

`step_time`: the learner's `my_step_time(compute_s, nbytes, world_size,
link)` is the step of the capstone's simulated DDP: the whole compute, then
one ring all-reduce of all the gradients that nothing hides (one bucket,
ready only at the end of backward). It is checked in the kernel against
`ddp_teach.cost.allreduce_time` (the charge the simulator makes) over
world sizes from 1 to 1024, buffers from half a megabyte to a gigabyte and
the course's links, with the compute small and large. A wrong answer is
compared with what each typical mistake would give (the compute or the
communication left out, the latency or the bandwidth term left out, the
whole buffer sent at every ring step, 2N ring steps instead of 2(N-1)) so
that the hint names it.
"""
import math

from ddp_teach.cost import allreduce_time
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)
from ddp_teach.sim.hardware import LINKS

CASES = [(compute_s, nbytes, world_size, link_name)
         for compute_s in (1e-3, 0.2)
         for nbytes in (467_336, 25e6, 1e9)
         for world_size in (1, 2, 8, 64, 1024)
         for link_name in ("NVLink 4", "InfiniBand NDR", "10GbE")]
FORMULA = ("t = compute_s + 2(N-1) alpha + 2(N-1)/N nbytes beta, "
           "with N = world_size")


def compute_then_allreduce(allreduce):
    """The exercise's my_step_time from the course's `allreduce_time`: the
    compute, then the one all-reduce of every gradient, after backward."""
    def step_time(compute_s, nbytes, world_size, link):
        return compute_s + allreduce(nbytes, world_size, link)
    return step_time


def _mistakes(compute_s, nbytes, n, link):
    """What each typical mistake returns, with the hint that names it."""
    steps = 2 * (n - 1)
    latency, bandwidth = steps * link.alpha, steps / n * nbytes * link.beta
    return [
        (compute_s, "the communication is missing: after backward every "
                    "rank still all-reduces the gradients, and the step waits."),
        (latency + bandwidth, "the compute is missing: the all-reduce starts "
                              "only when backward has finished, so the two add."),
        (max(compute_s, latency + bandwidth),
         "nothing overlaps here: the one bucket is ready only at the end of "
         "backward, so the all-reduce follows the compute; add the two."),
        (compute_s + bandwidth, "the latency term is missing: each of the "
                                "2(N-1) ring steps is a message and pays alpha. "
                                "For half a megabyte on 64 GPUs it is most of "
                                "the time."),
        (compute_s + latency, "the bandwidth term is missing: the bytes cost "
                              "too, 2(N-1)/N x nbytes x beta in all."),
        (compute_s + latency + steps * nbytes * link.beta,
         "each ring step sends one N-th of the buffer, not all of it: "
         "2(N-1)/N x nbytes x beta in all."),
        (compute_s + 2 * n * link.alpha + 2 * nbytes * link.beta,
         "a ring of N ranks takes 2(N-1) steps (N-1 to reduce-scatter, N-1 "
         "to all-gather), not 2N: with one rank there are none."),
    ]


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)


def _want(compute_s, nbytes, world_size, link_name) -> float:
    return compute_s + allreduce_time(nbytes, world_size, LINKS[link_name])


def check_step_time(fn) -> Verdict:
    answers = []
    for compute_s, nbytes, world_size, link_name in CASES:
        try:
            answers.append(fn(compute_s, nbytes, world_size, LINKS[link_name]))
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    wrong = [(case, got) for case, got in zip(CASES, answers)
             if not (isinstance(got, (int, float)) and _close(float(got), _want(*case)))]
    if not wrong:
        return Verdict(CORRECT, "the alpha-beta step time on 1 to 1024 GPUs, on "
                                "NVLink, InfiniBand and 10 Gb Ethernet, from half "
                                "a megabyte of gradients to a gigabyte.")
    (compute_s, nbytes, world_size, link_name), got = wrong[0]
    shown = (f"compute_s={compute_s:g}, nbytes={nbytes:g}, world_size="
             f"{world_size}, link={link_name}: expected "
             f"{_want(compute_s, nbytes, world_size, link_name):.6g} s, "
             f"got {got!r}.\nHint: ")
    if not all(isinstance(got, (int, float)) for got in answers):
        return Verdict(WRONG, shown + "return the step time in seconds, a float.")
    # the mistake that gives every one of the learner's answers
    per_mistake = zip(*(_mistakes(c, b, n, LINKS[name]) for c, b, n, name in CASES))
    for made in per_mistake:
        if all(_close(float(got), value) for got, (value, _) in zip(answers, made)):
            return Verdict(WRONG, shown + made[0][1])
    return Verdict(WRONG, shown + FORMULA + ".")


register(Exercise(
    "step_time", "The step time of DDP on N GPUs", "my_step_time",
    "ddp_teach.cost:allreduce_time", check_step_time,
    ["Nothing hides the all-reduce here: the step is the compute, then the "
     "all-reduce of all nbytes.",
     "A ring all-reduce on N ranks is 2(N-1) steps; each sends nbytes/N "
     "bytes and costs link.alpha + nbytes/N * link.beta."],
    adapt=compute_then_allreduce,
    stub_parameters=("compute_s", "nbytes", "world_size", "link")))
