"""The async all-reduce that notebook 03's hook checker (nb03_hook.py)
hands the learner's hook: it makes waiting visible. Its sum lands in the
caller's tensor, and its future completes, only when the checker releases
it after backward, or at the work's `wait()` (noted). Until then the tensor
holds CANARY, so that a write to it while in flight shows; a hook that
waits on the future inside backward stands still until HOLD_S has passed.
It answers as torch's Work does: wait(), is_completed(), get_future().
"""
import threading

import torch
import torch.distributed as dist

from ddp_teach.exercises.harness import HeldWork

HOLD_S = 3.0  # a backward of this tiny model stuck this long waits on a held future
CANARY = 12345.0  # param.grad's value while its all-reduce is in flight


class HeldAllReduce(HeldWork):
    """An async all-reduce whose sum lands in the caller's tensor (and whose
    future completes) only at `release()`, or at the work's `wait()`, which
    is noted. Until then the tensor holds CANARY, so that a write to it in
    flight shows."""

    def __init__(self, all_reduce, tensor, args, kwargs):
        with torch.no_grad():  # the hook may have handed over the parameter
            self.tensor, self.landing = tensor, tensor.detach().clone()
            self.work = all_reduce(self.landing, *args, **kwargs)
            tensor.fill_(CANARY)
        super().__init__()
        self.written_in_flight = False
        self.lock = threading.Lock()  # the checker and backward's thread may both release

    def release(self) -> None:
        with self.lock:
            if self.future.done():
                return
            self.written_in_flight = not bool((self.tensor == CANARY).all())
            self.work.wait()
            with torch.no_grad():
                self.tensor.copy_(self.landing)
            self.future.set_result([self.tensor])


class Spy:
    """dist.all_reduce as the hooks see it: notes what each call reduced,
    how, and holds the async ones (see HeldAllReduce)."""

    def __init__(self, params):
        self.params, self.real = params, dist.all_reduce
        self.calls, self.held, self.release_at_once = [], [], False

    def __call__(self, tensor, *args, **kwargs):
        op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
        self.calls.append({
            "parameter": any(tensor.data_ptr() == p.data_ptr() for p in self.params),
            "average": op == dist.ReduceOp.AVG, "async": bool(kwargs.get("async_op"))})
        if not kwargs.get("async_op"):
            return self.real(tensor, *args, **kwargs)
        self.held.append(HeldAllReduce(self.real, tensor, args, kwargs))
        if self.release_at_once:
            self.held[-1].release()
        return self.held[-1]

    def release_all(self) -> None:
        self.release_at_once = True
        for held in list(self.held):
            held.release()


def backward_watched(loss, spy) -> bool:
    """Backward in a thread of its own, the async all-reduces held; True if
    it stood still for HOLD_S (a hook waiting on a held future)."""
    error = []

    def run():
        try:
            loss.backward()
        except BaseException as raised:  # handed to the worker's thread below
            error.append(raised)
    thread = threading.Thread(target=run, daemon=True)
    dist.all_reduce = spy
    try:
        thread.start()
        thread.join(HOLD_S)
        stuck = thread.is_alive()
        spy.release_all()
        thread.join()
    finally:
        dist.all_reduce = spy.real
    if error:
        raise error[0]
    spy.release_all()
    return stuck
