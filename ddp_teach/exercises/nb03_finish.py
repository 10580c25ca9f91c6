"""Checker for notebook 03's finishing step: `my_finish(buckets,
world_size)` after backward, for buckets that hold a COPY of the gradients.

What the reference, `dt.ddp.finish_buckets`, guarantees, each property
checked on 2 and 3 real ranks, with the hint that names the mistake:
- every bucket's work is waited for, and its buffer neither read nor
  written before that wait returns (until then the sum may be half there);
- the buffer's sum is divided by world_size, once;
- every parameter of every bucket gets its own slice back in its .grad,
  walking the buffer with a running offset in the bucket's parameter order.

The checker makes "before the wait" visible: each bucket's all-reduce runs
on a buffer of its own, and the sum lands in the bucket's buffer only when
the work's `wait()` is called. Until then the buffer holds CANARY, so a
gradient copied too early holds it, and a write to the buffer before the
wait (a division, say) is noted.
"""
import torch
import torch.distributed as dist

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.nb03_hook import PARAM_NAMES, batch_of, small_model as model
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG,
                                         Exercise, Verdict, register)

WORLD_SIZES = (1, 2, 3, 5)  # 1: the average is the rank's own gradient
CANARY = 1.0e6  # a bucket's buffer until its wait(); gradients here are < 10


class _LandsAtWait:
    """The async all-reduce of a bucket's buffer, whose sum lands in the
    buffer at `wait()` (noted, with whether the buffer was written first)."""

    def __init__(self, buffer):
        self.buffer, self.landing = buffer, buffer.clone()
        self.work = dist.all_reduce(self.landing, async_op=True)
        buffer.fill_(CANARY)
        self.waited = self.written_before_wait = False

    def wait(self, *args, **kwargs):
        if not self.waited:
            self.written_before_wait = not bool((self.buffer == CANARY).all())
            self.work.wait(*args, **kwargs)
            self.buffer.copy_(self.landing)
            self.waited = True
        return True

    def is_completed(self) -> bool:
        """As torch's Work: True once done, the sum then in the buffer (a
        learner may poll instead of waiting)."""
        if self.work.is_completed():
            self.wait()
        return self.waited

    def get_future(self):
        """As torch's Work: a future whose wait() (or value()) returns once
        the sum is in the buffer."""
        return _LandingFuture(self)

    def finish(self) -> None:
        """The checker's own wait, for a work the learner left: the
        collective must end before the worker does."""
        self.work.wait()


class _LandingFuture:
    """The future of a `_LandsAtWait`: waiting on it is waiting on the
    work (torch's `work.get_future().wait()` returns the reduced tensors)."""

    def __init__(self, work):
        self._work = work

    def wait(self):
        self._work.wait()
        return [self._work.buffer]

    value = wait

    def done(self) -> bool:
        return self._work.is_completed()

    def then(self, callback):
        self.wait()
        finished = torch.futures.Future()
        finished.set_result(callback(self))
        return finished


def _layout(params):
    """Two buckets in backward order: the last layer's, then the first's."""
    return [params[2:][::-1], params[:2][::-1]]


def _expected(world_size):
    """Per rank, its own gradients; and the average over ranks."""
    local = []
    for rank in range(world_size):
        net = model()
        net(batch_of(rank)).square().mean().backward()
        local.append([p.grad for p in net.parameters()])
    return local, [sum(grads) / world_size for grads in zip(*local)]


def _finish_on_ranks(rank, world_size, finish):
    net = model()
    net(batch_of(rank)).square().mean().backward()
    params = list(net.parameters())
    buckets = []
    for group in _layout(params):
        buffer = torch.cat([p.grad.flatten() for p in group])
        buckets.append({"buffer": buffer, "work": _LandsAtWait(buffer), "params": group})
    try:
        finish(buckets, world_size)
    except NotImplementedError:
        return NOT_ATTEMPTED
    finally:
        for bucket in buckets:
            bucket["work"].finish()
    return {"waited": [b["work"].waited for b in buckets],
            "written": any(b["work"].written_before_wait for b in buckets),
            "grads": [p.grad.clone() for p in params]}


def _close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def _sliced_in_reverse(average):
    """What each .grad holds when a bucket's parameters are walked in
    reverse: each takes the slice at another's offset."""
    params = list(model().parameters())
    out = [None] * len(params)
    for group in _layout(list(range(len(params)))):
        flat, offset = torch.cat([average[i].flatten() for i in group]), 0
        for i in group[::-1]:
            out[i] = flat[offset:offset + params[i].numel()].view_as(params[i])
            offset += params[i].numel()
    return out


def _hint(seen, world_size, local, average) -> str:
    got = seen["grads"]
    if any((g.abs() >= CANARY / world_size ** 2).any() for g in got):
        return ("a gradient was copied out of its bucket's buffer before the "
                "bucket's work.wait() returned: until then the sum may be half "
                f"there (here the buffer held {CANARY:g} until wait()). Wait for "
                "the bucket's work first, then divide and copy.")
    if seen["written"]:
        return ("the buffer was changed (divided?) before its work.wait() "
                "returned: the all-reduce was still writing the sum into it, "
                "so the sum overwrote your change (or, on a real network, "
                "mixed with it). Wait first, then divide.")
    flat_got = torch.cat([g.flatten() for g in got])
    flat_average = torch.cat([a.flatten() for a in average])
    ratio = (flat_got @ flat_average / (flat_average @ flat_average)).item()
    if _close(flat_got, flat_average * ratio):  # the average, scaled
        if abs(ratio - world_size) < 1e-3:
            return "the gradients are the SUM over ranks: divide the buffer by world_size."
        if abs(ratio - 1 / world_size) < 1e-3:
            return ("the gradients were divided by world_size twice (the "
                    "buffer and the slice?): divide once.")
        return (f"the gradients are the average times {ratio:.4g}: divide the "
                f"sum by world_size ({world_size}), not by another count.")
    if all(_close(g, mine) for g, mine in zip(got, local)):
        return ("every .grad still holds this rank's own gradient: copy each "
                "parameter's slice of the averaged buffer back into param.grad.")
    first, second = _layout(list(range(len(got))))
    if all(_close(got[i], average[i]) for i in first) and \
            all(_close(got[i], local[i]) for i in second):
        return ("the parameters of the second bucket still hold their own "
                "gradient: finish EVERY bucket (a return inside the loop?).")
    if all(_close(g, w) for g, w in zip(got, _sliced_in_reverse(average))):
        return ("the slices went to the parameters in reverse: the buffer holds "
                "the gradients in bucket[\"params\"] order, so walk that list "
                "as it is.")
    return ("some parameters' gradients are right, others not: walk the "
            "buffer with a running offset: a parameter's slice starts where "
            "the previous one's ended, in the bucket's parameter order.")


def check_finish(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_finish_on_ranks, world_size, fn)
        if problem:
            return problem
        local, average = _expected(world_size)
        seen = results[0]
        if not all(seen["waited"]):
            return Verdict(WRONG, f"on {world_size} rank{'s' * (world_size > 1)}, "
                           f"bucket {seen['waited'].index(False)}'s work was "
                           "never waited for.\n"
                           "Hint: call work.wait() before reading the buffer: "
                           "until then the sum may be half done.")
        if all(_close(g, a) for g, a in zip(seen["grads"], average)) and not seen["written"]:
            continue
        where = first_difference(seen["grads"], average, PARAM_NAMES)
        return Verdict(WRONG, f"on {world_size} rank{'s' * (world_size > 1)} "
                       "(rank 0 shown), the gradients after your finishing "
                       "step are not the average over the ranks"
                       + (f": {where}" if where else "") + ".\n"
                       "Hint: " + _hint(seen, world_size, local[0], average))
    return Verdict(CORRECT, "waited, averaged and copied back, every bucket, on "
                            f"{WORLD_SIZES} ranks.")


register(Exercise(
    "ddp_finish", "Finishing the synchronisation", "my_finish",
    "ddp_teach.ddp:finish_buckets", check_finish,
    ["For each bucket: wait for its work before touching its buffer, then "
     "divide the buffer by world_size.",
     "Copy slices back with a running offset: "
     "buffer[offset:offset + p.numel()].view_as(p), in bucket[\"params\"] order."]))
