"""Checker for notebook 11's exercise: the step time of DDP on N GPUs,
predicted with the alpha-beta model before the simulator gives it.

`step_time`: the learner's `my_step_time(compute_s, nbytes, world_size,
link)` is the step of the capstone's simulated DDP: the whole compute, then
one ring all-reduce of all the gradients that nothing hides (one bucket,
ready only at the end of backward). It is checked in the kernel against
`ddp_teach.cost.allreduce_time` (the charge the simulator makes) over
world sizes from 1 to 1024, buffers from half a megabyte to a gigabyte and
three of the course's links, with the compute small and large.

What the reference guarantees, and the mistakes that break each property
(each named by its own hint when every answer is what that mistake gives):
1. the compute and the all-reduce add, nothing overlaps: the compute or the
   communication left out, the larger of the two, the compute divided
   among the ranks;
2. the all-reduce is a ring of 2(N-1) messages: 2N of them, N-1 (a
   reduce-scatter alone), 2 log2 N (a tree), one message;
3. each message carries nbytes/N: the whole buffer at every step, twice
   the buffer in all, nbytes divided by N twice;
4. alpha per message and beta per byte: the latency or the bandwidth term
   left out, bits for bytes, bandwidth multiplied instead of divided;
5. seconds: milliseconds or microseconds;
6. the arguments are used: a link or a world size fixed in the code, an
   answer that does not change at all;
7. one GPU has nothing to all-reduce: exactly compute_s;
8. a real number comes back, not a tensor.
A wrong answer that is none of these is probed property by property (the
compute, where it is larger and where the all-reduce is, so that an
answer assuming overlap is named; then one GPU, then the latency, then the
bytes), and the hint says which one failed, with what the learner's
function gave.
"""
import math
import numbers

from ddp_teach.cost import allreduce_time
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)
from ddp_teach.sim.model.hardware import LINKS

CHECKED_LINKS = ("NVLink 4", "InfiniBand NDR", "10GbE")
# smallest first (fewest GPUs, then fewest bytes, then the shorter
# compute), so that the first wrong answer, which the verdict shows, is the
# smallest case that fails
CASES = [(compute_s, nbytes, world_size, link_name)
         for world_size in (1, 2, 8, 64, 1024)
         for nbytes in (467_336, 25e6, 1e9)
         for compute_s in (1e-3, 0.2)
         for link_name in CHECKED_LINKS]
FORMULA = ("t = compute_s + 2(N-1) alpha + 2(N-1)/N nbytes beta, "
           "with N = world_size")


def compute_then_allreduce(allreduce):
    """The exercise's my_step_time from the course's `allreduce_time`: the
    compute, then the one all-reduce of every gradient, after backward."""
    def step_time(compute_s, nbytes, world_size, link):
        return compute_s + allreduce(nbytes, world_size, link)
    return step_time


def _ring(nbytes, n, link, messages, share):
    """An all-reduce of `messages` messages that send `share` x nbytes (and
    reduce (N-1)/N of them, at link.gamma, which the checked links have 0)."""
    return (messages * link.alpha + share * nbytes * link.beta
            + (n - 1) / n * nbytes * link.gamma)


def _mistakes():
    """(hint, what the mistake returns for (compute_s, nbytes, N, link))."""
    def ring(b, n, link):
        return _ring(b, n, link, 2 * (n - 1), 2 * (n - 1) / n)

    found = [
        ("the communication is missing: after backward every rank still "
         "all-reduces the gradients, and the step waits.",
         lambda c, b, n, link: c),
        ("the compute is missing: the all-reduce starts only when backward "
         "has finished, so the two add.",
         lambda c, b, n, link: ring(b, n, link)),
        ("nothing overlaps here: the one bucket is ready only at the end of "
         "backward, so the all-reduce follows the compute; add the two.",
         lambda c, b, n, link: max(c, ring(b, n, link))),
        ("compute_s is one GPU's time for its own share of the batch, and "
         "all the GPUs compute at the same time: do not divide it by N.",
         lambda c, b, n, link: c / n + ring(b, n, link)),
        ("the latency term is missing: each of the 2(N-1) ring steps is a "
         "message and pays alpha. For half a megabyte on 64 GPUs it is most "
         "of the time.",
         lambda c, b, n, link: c + _ring(b, n, link, 0, 2 * (n - 1) / n)),
        ("alpha is paid by every message, not once: the ring sends 2(N-1) "
         "of them, one after the other.",
         lambda c, b, n, link: c + _ring(b, n, link, 1, 2 * (n - 1) / n)),
        ("the bandwidth term is missing: the bytes cost too, 2(N-1)/N x "
         "nbytes x beta in all.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * (n - 1), 0)),
        ("each ring step sends one N-th of the buffer, not all of it: "
         "2(N-1)/N x nbytes x beta in all.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * (n - 1), 2 * (n - 1))),
        ("the bytes are 2(N-1)/N x nbytes, not 2 x nbytes: 2(N-1) steps "
         "that each send nbytes/N.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * (n - 1), 2)),
        ("nbytes is the whole gradient buffer; a ring step sends nbytes/N of "
         "it. You divided by N twice.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * (n - 1),
                                         2 * (n - 1) / n / n)),
        ("a ring of N ranks takes 2(N-1) steps (N-1 to reduce-scatter, N-1 "
         "to all-gather), not 2N: with one rank there are none.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * n, 2)),
        ("that is a reduce-scatter alone (N-1 steps): an all-reduce is a "
         "reduce-scatter then an all-gather, 2(N-1) steps and twice the bytes.",
         lambda c, b, n, link: c + _ring(b, n, link, n - 1, (n - 1) / n)),
        ("that is a tree's latency (2 log2 N messages); the simulator charges "
         "a ring, which sends 2(N-1) messages one after the other.",
         lambda c, b, n, link: c + _ring(b, n, link, 2 * math.ceil(math.log2(n)),
                                         2 * (n - 1) / n)),
        ("nbytes is in bytes and link.beta in seconds per byte: no factor 8 "
         "(bits) is needed.",
         lambda c, b, n, link: c + _ring(8 * b, n, link, 2 * (n - 1), 2 * (n - 1) / n)),
        ("nbytes is in bytes and link.beta in seconds per byte: no division "
         "by 8 (bits) is needed.",
         lambda c, b, n, link: c + _ring(b / 8, n, link, 2 * (n - 1), 2 * (n - 1) / n)),
        ("link.bandwidth is bytes per second: the bytes' time is nbytes "
         "divided by it (or times link.beta), not multiplied.",
         lambda c, b, n, link: c + 2 * (n - 1) * link.alpha
         + 2 * (n - 1) / n * b * link.bandwidth),
        ("return seconds, as compute_s is given: yours is in milliseconds.",
         lambda c, b, n, link: 1e3 * (c + ring(b, n, link))),
        ("return seconds, as compute_s is given: yours is in microseconds.",
         lambda c, b, n, link: 1e6 * (c + ring(b, n, link))),
    ]
    for name in CHECKED_LINKS:
        found.append((
            f"your answers are right for the {name} link only: use the link "
            f"the checker passes (link.alpha, link.beta), not one of your own.",
            lambda c, b, n, link, fixed=LINKS[name]: c + ring(b, n, fixed)))
    for fixed_n in (8, 64):
        found.append((
            f"your answers are right for {fixed_n} GPUs only: use world_size.",
            lambda c, b, n, link, fixed_n=fixed_n: c + ring(b, fixed_n, link)))
    return found


MISTAKES = _mistakes()


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)


def _want(compute_s, nbytes, world_size, link_name) -> float:
    return compute_s + allreduce_time(nbytes, world_size, LINKS[link_name])


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _probe(fn) -> str:
    """Which property a wrong answer breaks, tried one by one on the
    InfiniBand link: the compute, one GPU, the latency, the bytes."""
    link = LINKS["InfiniBand NDR"]
    n, nbytes = 64, 25e6
    messages, share = 2 * (n - 1), 2 * (n - 1) / n
    try:
        grows = float(fn(1.2, nbytes, n, link)) - float(fn(0.2, nbytes, n, link))
        if not math.isclose(grows, 1.0, rel_tol=1e-6):
            return (f"with one second more of compute your step grows by "
                    f"{grows:.6g} s: nothing overlaps the compute here, so it "
                    f"must grow by exactly 1 s (the two add).")
        slow = LINKS["10GbE"]  # a gigabyte on it: seconds of all-reduce
        hidden = float(fn(0.1, 1e9, n, slow)) - float(fn(0.0, 1e9, n, slow))
        if not math.isclose(hidden, 0.1, rel_tol=1e-6):
            return (f"where the all-reduce is long (a gigabyte on 10GbE, "
                    f"{n} GPUs), 0.1 s more of compute makes your step "
                    f"{hidden:.6g} s longer, not 0.1 s: your answer lets "
                    "the compute overlap the all-reduce (a max, or part of "
                    "one hidden in the other). Here nothing overlaps: the "
                    "one bucket is ready only at the end of backward, so "
                    "the step is the compute PLUS the all-reduce.")
        alone = fn(0.2, nbytes, 1, link)
        if not _close(float(alone), 0.2):
            return (f"with one GPU (compute_s=0.2, world_size=1) your function "
                    f"returns {alone!r}: there is nothing to all-reduce, so the "
                    f"step is compute_s alone.")
        latency = float(fn(0.0, 0, n, link))
        if not _close(latency, messages * link.alpha):
            return (f"with nbytes=0 and compute_s=0 on {n} GPUs your function "
                    f"returns {latency:.6g} s: the ring still sends 2(N-1) = "
                    f"{messages} messages, each paying link.alpha: "
                    f"{messages * link.alpha:.6g} s.")
        data = float(fn(0.0, nbytes, n, link)) - latency
        want = _ring(nbytes, n, link, 0, share)
        if not _close(data, want):
            return (f"the bytes: {nbytes:g} bytes on {n} GPUs add {data:.6g} s "
                    f"in yours; each of the {messages} messages carries "
                    f"nbytes/N, at link.beta seconds per byte: {want:.6g} s.")
    except Exception:  # noqa: BLE001 - the learner's code, probed off its cases
        return FORMULA + "."
    return (f"{FORMULA}. Yours gives it for {n} GPUs on InfiniBand, but not in "
            f"the case above: look for a branch that treats some world sizes, "
            f"sizes or links differently.")


def check_step_time(fn) -> Verdict:
    answers = []
    for compute_s, nbytes, world_size, link_name in CASES:
        try:
            answers.append(fn(compute_s, nbytes, world_size, LINKS[link_name]))
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    wrong = [(case, got) for case, got in zip(CASES, answers)
             if not (_is_number(got) and _close(float(got), _want(*case)))]
    if not wrong:
        return Verdict(CORRECT, "the alpha-beta step time on 1 to 1024 GPUs, on "
                                "NVLink, InfiniBand and 10 Gb Ethernet, from half "
                                "a megabyte of gradients to a gigabyte.")
    (compute_s, nbytes, world_size, link_name), got = wrong[0]
    shown = (f"the smallest case that fails, of {len(CASES)}: compute_s="
             f"{compute_s:g}, nbytes={nbytes:g}, world_size="
             f"{world_size}, link={link_name}: expected "
             f"{_want(compute_s, nbytes, world_size, link_name):.6g} s, "
             f"got {got!r}.\nHint: ")
    if not all(_is_number(got) for got in answers):
        return Verdict(WRONG, shown + "return the step time in seconds, a float.")
    answers = [float(got) for got in answers]
    if all(_close(got, answers[0]) for got in answers):
        return Verdict(WRONG, shown + f"your function returns {answers[0]:.6g} "
                       "whatever it is given: the step time depends on "
                       "compute_s, nbytes, world_size and the link.")
    for hint, mistake in MISTAKES:
        if all(_close(got, mistake(c, b, n, LINKS[name]))
               for got, (c, b, n, name) in zip(answers, CASES)):
            return Verdict(WRONG, shown + hint)
    return Verdict(WRONG, shown + _probe(fn))


register(Exercise(
    "step_time", "The step time of DDP on N GPUs", "my_step_time",
    "ddp_teach.cost:allreduce_time", check_step_time,
    ["Nothing hides the all-reduce here: the step is the compute, then the "
     "all-reduce of all nbytes.",
     "A ring all-reduce on N ranks is 2(N-1) steps; each sends nbytes/N "
     "bytes and costs link.alpha + nbytes/N * link.beta."],
    adapt=compute_then_allreduce,
    stub_parameters=("compute_s", "nbytes", "world_size", "link")))
