"""Mixed precision for data parallelism: a dynamic loss scaler and 16-bit
gradient communication, both written to be read.

Loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018,
arXiv:1710.03740): fp16 cannot hold numbers below 2^-24, and many gradients
are that small, so they would flush to zero. Multiplying the loss by a large
factor S multiplies every gradient by S (backward is linear), lifting them
into fp16's range; dividing the gradients by S before the optimizer step
undoes it. S is chosen dynamically: start high (65536), halve it and skip the
step whenever a gradient overflowed to inf/NaN, and double it after a long run
(2000 steps) without overflow. `LossScaler` does this with the methods and
defaults of `torch.amp.GradScaler`, so the two are interchangeable in a loop
(GradScaler keeps the scale and the inf flag as tensors on the device and
reads the flag with `.item()` in `step()`, one wait for a GPU per step unless
the optimizer is fused; here the scale is a Python float, as suits a CPU):

    scaler.scale(loss).backward()   # DDP averages the scaled gradients
    scaler.unscale_(optimizer)      # back to true size: clip after this
    clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)          # skipped if anything was inf/NaN
    scaler.update()                 # grow or back off the scale

With data parallelism every rank sees the same averaged gradients, so every
rank finds the same inf and skips the same step: the replicas stay equal.

16-bit gradient communication (torch's `fp16_compress_hook` and
`bf16_compress_hook`, torch/distributed/algorithms/ddp_comm_hooks/
default_hooks.py): cast each bucket to fp16 or bf16 before the all-reduce and
back afterwards, halving the bytes sent. Each rank divides its 16-bit copy
by the world size *before* the all-reduce, because the sum of N fp16 values
can overflow where their average does not (torch's hooks do the same: cast,
divide, all-reduce; a gradient already past 65504 is inf in fp16 either way). (Ours are not named like torch's:
torch's DDP refuses any hook named `bf16_compress_hook` unless torch has CUDA
(or ROCm) and NCCL, or Intel's XPU and XCCL, though gloo all-reduces bf16 on
CPU well.) The hooks follow torch's comm-hook
contract, `hook(process_group, bucket) -> Future[Tensor]`, so the same
function works with torch's DDP (`register_comm_hook`) and the course's
(`dt.ddp.DistributedDataParallel.register_comm_hook`).
"""
import torch
import torch.distributed as dist

FP32_MAX = torch.finfo(torch.float32).max


class LossScaler:
    """Dynamic loss scaling with `torch.amp.GradScaler`'s behaviour.

    The scale grows by `growth_factor` after `growth_interval` consecutive
    steps without inf/NaN gradients and shrinks by `backoff_factor` on any
    step that had one (that step is skipped). `device` is accepted for
    GradScaler compatibility; the scale lives on the CPU as a Python float.
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be between 0 and 1, got "
                             f"{backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(
                growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an integer >= 1, got "
                             f"{growth_interval!r}")
        self.device, self.enabled = device, enabled
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self._scale = float(init_scale)
        self._growth_tracker = 0  # clean steps since the last change
        self._found_inf: dict[int, bool] = {}  # per optimizer, this iteration
        self._stepped: set[int] = set()

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, outputs):
        """Multiply a loss (or a list/tuple of them) by the scale."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(output) for output in outputs)
        raise TypeError(f"scale() takes a tensor or a list/tuple of tensors, got "
                        f"{type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Divide `optimizer`'s gradients by the scale, in place, and note
        whether any is inf/NaN. Call it before clipping; at most once per
        optimizer between two `update()` calls."""
        if not self.enabled:
            return
        key = id(optimizer)
        if key in self._found_inf:
            raise RuntimeError("unscale_() was already called on this optimizer "
                               "since the last update(): call it once per step")
        if key in self._stepped:
            raise RuntimeError("unscale_() must come before step() in an iteration")
        inverse = 1.0 / self._scale
        found_inf = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not torch.isfinite(param.grad).all():
                    found_inf = True
                param.grad.mul_(inverse)
        self._found_inf[key] = found_inf

    def step(self, optimizer, *args, **kwargs):
        """Unscale (if not done yet), then step, unless a gradient was inf/NaN:
        then the step is skipped and None returned."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("closures are not supported with loss scaling "
                               "(GradScaler refuses them too)")
        if id(optimizer) in self._stepped:
            raise RuntimeError("step() was already called on this optimizer "
                               "since the last update()")
        if id(optimizer) not in self._found_inf:
            self.unscale_(optimizer)
        self._stepped.add(id(optimizer))
        if self._found_inf[id(optimizer)]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """End the iteration: back off if any optimizer saw inf/NaN, else
        count a clean step and grow after `growth_interval` of them."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        else:
            if not self._found_inf:
                raise RuntimeError("update() found no unscale_() or step() in "
                                   "this iteration: call scaler.step(optimizer) "
                                   "first")
            self._scale, self._growth_tracker = next_scale(
                self._scale, self._growth_tracker, any(self._found_inf.values()),
                self.growth_factor, self.backoff_factor, self.growth_interval)
        self._found_inf.clear()
        self._stepped.clear()

    def state_dict(self) -> dict:
        return {"scale": self._scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self._scale = float(state["scale"])
        self.growth_factor = state["growth_factor"]
        self.backoff_factor = state["backoff_factor"]
        self.growth_interval = state["growth_interval"]
        self._growth_tracker = state["_growth_tracker"]


def next_scale(scale: float, growth_tracker: int, found_inf: bool,
               growth_factor: float = 2.0, backoff_factor: float = 0.5,
               growth_interval: int = 2000) -> tuple[float, int]:
    """The update rule, on its own: (new scale, new count of clean steps).

    An overflow backs the scale off and restarts the count; a clean step adds
    one to the count, and the scale grows when the count reaches
    `growth_interval` (the count then restarts). Growth that would overflow
    the scale itself (an fp32 number in GradScaler) is not applied.
    """
    if found_inf:
        return scale * backoff_factor, 0
    clean_steps = growth_tracker + 1
    if clean_steps == growth_interval:
        grown = scale * growth_factor
        return (grown if grown <= FP32_MAX else scale), 0
    return scale, clean_steps


def _compressed_allreduce(process_group, bucket, dtype) -> torch.futures.Future:
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    # Divide first: N fp16 values can sum past 65504 where their mean can't.
    compressed = buffer.to(dtype).div_(dist.get_world_size(group))
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress(future) -> torch.Tensor:
        buffer.copy_(future.value()[0])
        return buffer
    return work.get_future().then(decompress)


def fp16_allreduce_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average a gradient bucket in fp16: half the bytes of fp32 on the
    wire; the result is written back into the bucket's own dtype."""
    return _compressed_allreduce(process_group, bucket, torch.float16)


def bf16_allreduce_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average a gradient bucket in bf16: fp32's range, half its bytes, but
    only 8 bits of precision."""
    return _compressed_allreduce(process_group, bucket, torch.bfloat16)
