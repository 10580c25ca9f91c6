"""What an async collective of a simulated run returns, and when backward runs.

`VirtualWork` wraps the real work of an async collective (`dist.*(...,
async_op=True)`) in a simulated run: the data moves for real, and waiting
for it moves the rank's compute stream to the collective's virtual end
(`ddp_teach.sim.runtime.recorder`).
"""
import torch


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass, its final
    callbacks (where DDP finishes its buckets) included."""
    return torch._C._current_graph_task_id() != -1


class VirtualWork:
    """An async collective's work: `wait()` waits for the real data, then
    moves the rank's compute stream to the collective's virtual end.

    torch's fake process group (`dt.sim.one_rank`) completes every work
    with the value None, where a real group's future holds the collective's
    tensors; torch's DDP hooks read that value, so here the future holds
    `tensor`, as a real group's would (its data stays this rank's)."""

    def __init__(self, work, end: float, recorder,
                 tensor=None):
        self._work, self._end, self._recorder = work, end, recorder
        self._tensor = tensor

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._recorder.wait_until(self._end)
        return result

    def get_future(self):
        end, recorder = self._end, self._recorder
        if in_backward():  # torch's DDP waits
            torch.autograd.Variable._execution_engine.queue_callback(  # at the
                lambda: recorder.wait_until(end))                      # end
        else:
            recorder.wait_until(end)
        future = self._work.get_future()
        if isinstance(self._tensor, torch.Tensor) and future.done() \
                and future.value() is None:  # the fake group's work
            future = torch.futures.Future()
            future.set_result([self._tensor])
        return future

    def __getattr__(self, name):
        return getattr(self._work, name)
