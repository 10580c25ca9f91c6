"""Checker for notebook 02's parallel_apply exercise, and the probe that
`nb02_forward` uses too.

What a value check cannot see, a probe module shows. Its replicas share one
`Meeting`: each replica's forward notes its thread and grad mode there, and
waits at a barrier until every replica has arrived. Replicas that run at the
same time pass it at once; a loop that starts and joins each thread in turn,
or a pool with fewer threads than replicas, leaves the first waiting until
MEET_TIMEOUT_S, and the meeting records how many were ever inside at once.
After the barrier the replicas finish in reverse order, STAGGER_S apart, so
that outputs kept in the order the threads finish come back reversed.
"""
import re
import threading
import time

import torch
from torch import nn

from ddp_teach.exercises.nb02_dataparallel import (CUT_GRAPH, describe, run_here,
                                                   same, values)
from ddp_teach.exercises.registry import CORRECT, WRONG, Exercise, Verdict, register

MEET_TIMEOUT_S = 3.0  # a serial run waits this long once; a parallel one not at all
STAGGER_S = 0.1
ROWS = 3              # rows per piece; piece i holds 10 i, 10 i + 1, 10 i + 2


class Meeting:
    """Where a probe's replicas meet. Shared by all of them: replicate copies
    tensors and modules, and a deepcopy keeps this same object."""

    def __init__(self, parties: int, stagger: bool = True, reverse: bool = True):
        self.parties, self.stagger, self.reverse = parties, stagger, reverse
        self.barrier = threading.Barrier(parties)
        self.caller = threading.current_thread()
        self.lock = threading.Lock()
        self.threads = []  # kept alive, so that no thread's ident is reused
        self.modules = []  # the modules that ran (replicas, or not)
        self.grad_modes = []
        self.inside = self.most_inside = 0

    def __deepcopy__(self, memo):
        return self

    def attend(self, index: int, module: nn.Module) -> None:
        """Replica `index` arrives: wait for the others, then finish in turn."""
        with self.lock:
            self.threads.append(threading.current_thread())
            self.modules.append(module)
            self.grad_modes.append(torch.is_grad_enabled())
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if threading.current_thread() is self.caller:
                return  # no thread of its own: nothing to wait for
            try:
                self.barrier.wait(MEET_TIMEOUT_S)
            except threading.BrokenBarrierError:
                return  # not all at once: the verdict says so
            if self.stagger:
                time.sleep(STAGGER_S * (self.parties - 1 - index if self.reverse
                                        else index))
        finally:
            with self.lock:
                self.inside -= 1

    def threads_verdict(self, what: str) -> Verdict | None:
        """WRONG when the replicas did not each run in a thread of their
        own, all at the same time; `what` says what to use instead."""
        in_caller = sum(t is self.caller for t in self.threads)
        if in_caller:
            return Verdict(WRONG, f"{in_caller} of the {self.parties} replicas "
                           f"ran in your calling thread, one after the other."
                           f"\nHint: {what}")
        if self.most_inside < self.parties:
            own = len({id(t) for t in self.threads})
            how = ("a pool with fewer threads than replicas makes some wait "
                   "for a free thread: give every replica a thread of its own"
                   if own < self.parties else
                   "each thread was joined before the next one started, so "
                   "the replicas ran one after another: start all the "
                   "threads first, then join them all")
            return Verdict(WRONG, f"the replicas had threads of their own but "
                           f"at most {self.most_inside} of {self.parties} ran at "
                           f"the same time.\nHint: {how}.")
        return None


class Probe(nn.Module):
    """x * scale (+ extra), noting in its meeting how it ran; a row of -1
    makes it raise."""

    def __init__(self, meeting: Meeting):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.meeting = meeting

    def forward(self, x, extra=None):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"forward(x, extra) got a {type(x).__name__} as x: "
                            f"a tuple input was not unpacked")
        self.meeting.attend(int(x[0, 0]) // 10, self)
        if (x == -1).any():
            raise ValueError("this replica got a bad row")
        return x * self.scale + (0 if extra is None else extra)


def probe_pieces(n: int) -> list:
    return [torch.arange(float(ROWS)).reshape(ROWS, 1) + 10 * i for i in range(n)]


UNPACK_HINT = ("an input that is a tuple holds the replica's positional "
               "arguments: call replicas[i](*inputs[i]).")


# (replicas, inputs are tuples, grad mode on), smallest first: one replica
# (which may run in the caller's thread, as torch's does), two, three; then
# tuple inputs, then grad mode off
APPLY_CASES = ((1, False, True), (2, False, True), (3, False, True),
               (3, True, True), (3, False, False))


def check_parallel_apply(fn) -> Verdict:
    """dt.dp.parallel_apply guarantees, for n replicas, inputs and devices:

    1. outputs: a list with replica i's output at index i, whatever order
       the threads finish in;
    2. threads: each replica runs in a thread of its own, all at the same
       time (not in the caller's thread, not started and joined in turn);
    3. arguments: an input that is a tuple is unpacked into positional
       arguments, anything else is the one argument;
    4. grad mode: each replica runs under the caller's
       torch.is_grad_enabled() (grad mode is per thread; a new thread
       starts with it on, so under torch.no_grad() it must be set again);
    5. errors: an exception in a replica's thread is raised in the caller,
       naming the replica (or its device) and keeping the message;
    6. one replica works too.

    Properties 1 to 4 are tried on `APPLY_CASES`, smallest first, and a
    verdict names the case that failed first (replicas, tuple inputs,
    grad mode) with the expected and received output.
    """
    from ddp_teach import dp
    for n, extra, grad in APPLY_CASES:
        meeting = Meeting(n)
        replicas = dp.replicate(Probe(meeting), ["cpu"] * n)
        pieces = probe_pieces(n)
        inputs = [(p, torch.ones(ROWS, 1)) for p in pieces] if extra else pieces
        with torch.set_grad_enabled(grad):
            got, failed = run_here(lambda: fn(replicas, inputs, ["cpu"] * n),
                                   [("tuple input was not unpacked", UNPACK_HINT)])
        if failed:
            return failed
        want = [p * 2 + (1 if extra else 0) for p in pieces]
        verdict = _outputs_verdict(got, want, extra)
        if verdict is None and n > 1:  # a lone replica may run in the caller's thread, as torch's does
            verdict = meeting.threads_verdict("start a threading.Thread per "
                                              "replica, then join() them all: "
                                              "that is the 'parallel'.")
        verdict = verdict or _grad_mode_verdict(got, meeting, grad)
        if verdict is not None:
            case = (f"{n} replica{'s' * (n > 1)}"
                    + (", each input a tuple (x, extra)" if extra else "")
                    + ("" if grad else ", under torch.no_grad()"))
            return Verdict(verdict.status, f"with {case}: {verdict.message}")
    return _error_verdict(fn)


def _outputs_verdict(got, want, extra) -> Verdict | None:
    if isinstance(got, (list, tuple)) and same(list(got), want):
        return None
    called = "replicas[i](*inputs[i]) for a tuple input" if extra else "replicas[i](inputs[i])"
    if not isinstance(got, (list, tuple)) or len(got) != len(want):
        return Verdict(WRONG, f"expected a list of {len(want)} outputs, got "
                       f"{describe(got)}.\nHint: return a list: replica i's "
                       f"output at index i.")
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w))
    shown = f"output {i} should be {called}: {values(want[i])}; got {values(got[i])}."
    if got[i] is None:
        return Verdict(WRONG, f"{shown}\nHint: nothing was stored at index {i} "
                       f"before your function returned. join() every thread "
                       f"before reading the results, and store each output "
                       f"yourself: a Thread throws its target's return value away.")
    if isinstance(got[i], BaseException):
        return Verdict(WRONG, f"{shown}\nHint: an exception caught in a thread "
                       f"must be raised in the caller after join(), not returned.")
    if all(any(same(g, w) for w in want) for g in got):
        return Verdict(WRONG, f"{shown} That is another replica's output.\nHint: "
                       f"store each output at its replica's index "
                       f"(results[i] = ...), not in the order the threads "
                       f"finish (results.append).")
    return Verdict(WRONG, f"{shown}\nHint: output i is {called}, nothing more.")


def _grad_mode_verdict(got, meeting, grad) -> Verdict | None:
    if grad and not all(g.requires_grad for g in got):
        return Verdict(WRONG, "with grad mode on, the outputs carry no autograd "
                       "graph, so backward would not reach the model.\nHint: "
                       "no torch.no_grad() in the threads, and none of "
                       + CUT_GRAPH + " on the outputs.")
    if not grad and (any(meeting.grad_modes) or any(g.requires_grad for g in got)):
        return Verdict(WRONG, "under torch.no_grad() the replicas still ran with "
                       "grad mode on, recording graphs for nothing.\nHint: grad "
                       "mode belongs to each thread and a new thread starts with "
                       "it on: read torch.is_grad_enabled() in the caller and "
                       "run each replica inside torch.set_grad_enabled(it).")
    return None


FAILING_REPLICAS = (1, 0, 2)  # one in the middle, the first, the last: replica i
# finishes STAGGER_S * i after the others meet, so every replica but the last
# has slower ones after it and an early raise is seen on every machine


def _names_replica(text: str, index: int) -> bool:
    """Whether an error's text names replica `index` (or its device), in
    any case: "Replica 1", "replica 1", "CPU:1", "device 1"."""
    text = text.lower()
    return any(re.search(rf"{name}\W*{index}(?!\d)", text)
               for name in ("replica", "cpu:", "device", "thread"))


def _error_verdict(fn) -> Verdict:
    """Property 5, for a failing replica in the middle, the first (the two
    after it finish later) and the last: the error reaches the caller
    naming the replica, with the original message, once every thread has
    finished (an early raise would leave replicas running)."""
    from ddp_teach import dp
    for failing in FAILING_REPLICAS:
        meeting = Meeting(3, stagger=True, reverse=False)
        replicas = dp.replicate(Probe(meeting), ["cpu"] * 3)
        bad = probe_pieces(3)
        bad[failing][1] = -1
        before = set(threading.enumerate())
        try:
            returned = fn(replicas, bad, ["cpu"] * 3)
        except Exception as exc:  # the learner's own error type: any will do
            running = [t for t in threading.enumerate()
                       if t not in before and t.is_alive()]
            for thread in running:  # the checker's tidy-up, not the verdict
                thread.join()
            text = f"{exc} {exc.__cause__ or ''}"
            if not ("bad row" in text and _names_replica(text, failing)):
                return Verdict(WRONG, f"replica {failing} failed and your function "
                               f"raised {type(exc).__name__}: {exc}\nHint: say "
                               "which replica (or device) failed and keep the "
                               "original message.")
            if running:
                return Verdict(WRONG, f"replica {failing} failed and your function "
                               f"raised while {len(running)} other replica "
                               f"thread{'s were' if len(running) > 1 else ' was'} "
                               "still running.\nHint: join() every thread "
                               "first, then raise the error you kept: threads "
                               "left running still use the replicas.")
            continue
        if isinstance(returned, (list, tuple)) and any(
                isinstance(r, BaseException) for r in returned):
            return Verdict(WRONG, f"replica {failing} raised an error and your "
                           "function returned the exception as its output.\n"
                           "Hint: raise it in the caller after join(), naming "
                           "the replica.")
        return Verdict(WRONG, f"replica {failing} raised an error inside its "
                       "thread, but your function returned normally.\nHint: an "
                       "exception in a thread is lost unless you catch it there, "
                       "keep it, and raise it again in the caller after join().")
    return Verdict(CORRECT, "outputs in order, one thread per replica all at "
                   "once, tuple inputs unpacked, the caller's grad mode, one "
                   "replica, and a failing replica (first, middle, last) is "
                   "named once every thread has finished.")

register(Exercise(
    "dp_parallel_apply", "parallel_apply", "my_parallel_apply",
    "ddp_teach.dp:parallel_apply", check_parallel_apply,
    ["One threading.Thread per replica, all started before any is joined; "
     "each stores its output at its index.",
     "Catch exceptions inside the thread and raise them again, naming the "
     "replica, after join(). Grad mode is per thread: pass the caller's on."]))
