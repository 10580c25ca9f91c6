"""DistributedDataParallel from scratch: a bucketed Reducer driven by hooks.

What torch's DDP does (Li et al., "PyTorch Distributed", VLDB 2020), in a
module a learner can read in one sitting:

1. Construction broadcasts rank 0's parameters (frozen ones too) and buffers,
   so every replica starts identical; after that, identical gradients keep
   them identical, so nothing is sent at forward time.
2. Gradients are grouped into buckets, filled in REVERSE parameter order
   (roughly the order backward produces them). Each parameter's `.grad` is
   a view into its bucket's flat buffer: autograd writes gradients straight
   into the buffer that is sent, and no copy is made either way.
3. An autograd hook per parameter marks it ready; when a bucket is full of
   ready gradients it is all-reduced asynchronously while backward goes on.
   Buckets are launched strictly in bucket order, so every rank issues the
   same collectives in the same order (out of order, ranks would hang).
4. At the end of backward (an autograd engine callback) the reducer launches
   what is left, waits, and divides by the world size: `.grad` holds the
   average when `backward()` returns.

Parameters that got no gradient in an iteration contribute zeros (their view
was zeroed before forward), so their buckets are still launched, in order, on
every rank and nothing hangs. With `find_unused_parameters=True` the ranks
also all-reduce a used/unused flag per parameter, as torch does, and a
parameter no rank used ends with `.grad = None` (so momentum or weight decay
leave it alone, as on one process); by default it keeps a zero gradient,
which spares that extra collective. `no_sync()` skips the reduction so gradients accumulate; the
first backward after it reduces the accumulated sum. `register_comm_hook`
replaces the all-reduce of each bucket with the caller's function, under
torch's contract (`hook(state, bucket) -> Future` of the averaged bucket), so
torch's hooks and `dt.amp`'s 16-bit ones work here too.

Where torch 2.13's buckets differ (torch/nn/parallel/distributed.py,
`_BucketCapacityConfig` and `_ddp_init_helper`; torch/csrc/distributed/
c10d/reducer.cpp, `Reducer::rebuild_buckets`), all seen with a comm hook in
notebook 03:
- torch's first iteration runs with ONE bucket per dtype and device (unless
  find_unused_parameters=True), since it does not know yet in which order
  the gradients come; its hooks record that order, and at the next forward
  (one later with static_graph=True) it rebuilds its buckets once, in the
  order rank 0 saw, broadcast to every rank. Ours are built at
  construction, in the reverse of `parameters()`, and never change: the
  same as torch's for a model whose layers run in the order they are
  defined, worse for one that uses an early-defined layer late.
- torch's first bucket is capped at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`)
  only when `bucket_cap_mb` is left unset (its default, 25 MiB); an explicit
  `bucket_cap_mb` caps the first bucket the same as the others. Ours caps
  the first at `first_bucket_cap_mb` (1 MiB unless told otherwise): our
  default gives torch's default buckets, and `first_bucket_cap_mb=cap` gives
  torch's buckets for an explicit `bucket_cap_mb=cap`.
- `bucket_cap_mb=None` means torch's default (25 MiB) to torch, one bucket
  for everything to us.
- with find_unused_parameters=True torch never rebuilds: it keeps the
  buckets it made at construction by walking `parameters()` in order and
  reversing the result, so its small first bucket (cap unset) holds the
  FIRST parameters and is reduced last. Ours are the same with or without
  the option.
- a model with several dtypes: both keep one dtype per bucket; torch
  launches the buckets of all dtypes as they fill, ours all the buckets of
  the first dtype, then the next dtype's.
Not done here: bucket rebuilding, buffer broadcast at every forward.
"""
import contextlib

import torch
import torch.distributed as dist

# the bucket rule lives in ddp_teach.buckets, which the simulator's DDP
# schedule (ddp_teach.sim.schedules.predict) uses too; these names stay dt.ddp's
from ddp_teach.buckets import FIRST_BUCKET_CAP_MB, MIB, bucket_indices, check_bucket_cap
from ddp_teach.tracing import labelled


def make_allreduce_hook(pending: list):
    """The simplest Reducer (notebook 03's exercise): a hook for
    `param.register_post_accumulate_grad_hook` that starts an async SUM of
    the parameter's fresh .grad and appends (param, work) to `pending`.

    Why async: the all-reduce of one gradient then travels while backward
    computes the next ones: the overlap of computation and communication of
    Li et al., "PyTorch Distributed", VLDB 2020.
    One collective per parameter is what buckets improve on (the class
    below); waiting and averaging are the finishing step's job.
    """
    def hook(param):
        pending.append((param, dist.all_reduce(param.grad, async_op=True)))
    return hook


def finish_buckets(buckets: list, world_size: int) -> None:
    """The finishing step for buckets that hold a COPY of the gradients
    (notebook 03's exercise): for each bucket (a dict with "buffer", "work"
    and "params"), wait for its all-reduce, divide by the world size, and
    copy each parameter's slice back into its .grad, in the bucket's order.

    `DistributedDataParallel` below only waits and divides
    (`_wait_and_average`): its .grads are views into the buffer, so there is
    nothing to copy back, as in torch's reducer (torch/csrc/distributed/c10d/
    reducer.cpp, `gradient_as_bucket_view`).
    """
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)
        offset = 0
        for param in bucket["params"]:
            size = param.numel()
            param.grad.copy_(bucket["buffer"][offset:offset + size].view_as(param))
            offset += size


def _trainable_parameters(module: torch.nn.Module) -> list:
    """The parameters DDP averages: those that require a gradient. None is a
    RuntimeError, as in torch's DDP: there would be no bucket to reduce.
    Checked before any communication, so every rank refuses, none hangs."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not trainable:
        count = sum(1 for _ in module.parameters())
        raise RuntimeError(
            f"DistributedDataParallel needs a module with a parameter that "
            f"requires a gradient; this {type(module).__name__} has {count} "
            f"parameters{', all frozen' if count else ''}. With nothing to "
            f"average, run it without DDP, or unfreeze the parameters to "
            f"train (param.requires_grad_(True)) before wrapping it")
    return trainable


class Bucket:
    """A flat buffer holding some parameters' gradients back to back."""

    def __init__(self, index: int, params: list):
        self.index, self.params = index, params
        dtype, device = params[0].dtype, params[0].device
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=dtype,
                                  device=device)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.ready = 0
        self.work = None

    def attach_grads(self) -> None:
        """Point each parameter's .grad at its view (zeroed if it was None)."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)  # a .grad made elsewhere: keep its values
            else:
                continue
            p.grad = view


class HookBucket:
    """What a communication hook is handed: the few methods of torch's
    `dist.GradBucket` that hooks use, over one of our buckets."""

    def __init__(self, bucket: Bucket, is_last: bool):
        self._bucket, self._is_last = bucket, is_last

    def index(self) -> int:
        return self._bucket.index

    def buffer(self) -> torch.Tensor:
        return self._bucket.buffer

    def parameters(self) -> list:
        return list(self._bucket.params)

    def gradients(self) -> list:
        return list(self._bucket.views)

    def is_last(self) -> bool:
        return self._is_last


class DistributedDataParallel(torch.nn.Module):
    """Drop-in for torch's DDP on one device per rank (default group).

    bucket_cap_mb: the buckets' cap in MiB (None: one bucket; 0: one per
    parameter); first_bucket_cap_mb: the first bucket's (1 MiB, as torch's
    when its bucket_cap_mb is left unset; pass the cap itself to get torch's
    buckets for an explicit bucket_cap_mb). The buckets are fixed at
    construction: see the module's doc for how torch's change."""

    def __init__(self, module: torch.nn.Module, bucket_cap_mb: float | None = 25.0,
                 find_unused_parameters: bool = False, *,
                 first_bucket_cap_mb: float = FIRST_BUCKET_CAP_MB):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError("DistributedDataParallel wraps a model (a "
                            f"torch.nn.Module); got a {type(module).__name__}. "
                            "Pass the model, e.g. "
                            "DistributedDataParallel(torch.nn.Linear(4, 2))")
        check_bucket_cap(bucket_cap_mb)
        check_bucket_cap(first_bucket_cap_mb, "first_bucket_cap_mb")
        trainable = _trainable_parameters(module)
        self.module = module
        self.find_unused_parameters = find_unused_parameters
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)
        cap = None if bucket_cap_mb is None else bucket_cap_mb * MIB
        groups = []
        for dtype in dict.fromkeys(p.dtype for p in trainable):  # one dtype a bucket
            same = [p for p in trainable if p.dtype == dtype]
            groups += [[same[i] for i in b] for b in bucket_indices(
                [p.numel() * p.element_size() for p in same], cap,
                first_bucket_cap_mb * MIB)]
        self.buckets = [Bucket(i, params) for i, params in enumerate(groups)]
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        self._view_of = {p: v for b in self.buckets for p, v in zip(b.params, b.views)}
        self._got_grad: set = set()  # parameters whose hook fired this backward
        self._sync = True
        self._pending = False   # a backward has started reducing
        self._next_launch = 0   # buckets launch in this order on every rank
        self._comm_hook = None  # (state, hook) once registered
        for handle in getattr(module, "_ddp_hook_handles", []):
            handle.remove()  # wrapped again (a re-run cell): the old hooks go
        module._ddp_hook_handles = [
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)
            for p in trainable]

    def forward(self, *args, **kwargs):
        for bucket in self.buckets:
            bucket.attach_grads()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the next backward outside reduces."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def register_comm_hook(self, state, hook) -> None:
        """Reduce each bucket with `hook(state, bucket)`, which must return a
        `torch.futures.Future` whose value is the bucket AVERAGED over ranks
        (DDP then divides no more). Register once, before the first backward."""
        if self._comm_hook is not None:
            raise RuntimeError("a communication hook is already registered; "
                               "wrap the module again to use another")
        if not callable(hook):
            raise TypeError(f"hook must be a function hook(state, bucket), got "
                            f"{type(hook).__name__}")
        self._comm_hook = (state, hook)

    def _on_gradient_ready(self, param) -> None:
        if not self._sync:
            return
        if not self._pending:
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self.finish_gradient_synchronization)
        bucket = self._bucket_of[param]
        if param.grad.data_ptr() != self._view_of[param].data_ptr():
            bucket.attach_grads()  # the .grad was replaced: bring it back home
        bucket.ready += 1
        self._got_grad.add(param)
        self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        """All-reduce, in bucket order, every bucket whose gradients are in."""
        while (self._next_launch < len(self.buckets)
               and self.buckets[self._next_launch].ready
               == len(self.buckets[self._next_launch].params)):
            self._launch(self.buckets[self._next_launch])

    def _launch(self, bucket: Bucket) -> None:
        with labelled(f"bucket {bucket.index}"):
            if self._comm_hook is None:
                bucket.work = dist.all_reduce(bucket.buffer, async_op=True)
            else:
                state, hook = self._comm_hook
                is_last = bucket.index == len(self.buckets) - 1
                bucket.work = hook(state, HookBucket(bucket, is_last))
        self._next_launch += 1

    def _wait_and_average(self, bucket: Bucket) -> None:
        if self._comm_hook is None:
            bucket.work.wait()
            bucket.buffer.div_(self.world_size)
            return
        averaged = bucket.work.wait()
        if isinstance(averaged, list):  # a hook that returned the work's future
            averaged = averaged[0]
        if averaged.data_ptr() != bucket.buffer.data_ptr():
            bucket.buffer.copy_(averaged)

    def finish_gradient_synchronization(self) -> None:
        """Launch what is left, wait, average. Runs at the end of backward;
        calling it again (or without a backward) does nothing."""
        if not self._pending:
            return
        for bucket in self.buckets[self._next_launch:]:
            self._launch(bucket)  # unused parameters: their zeros go too
        for bucket in self.buckets:
            self._wait_and_average(bucket)
            bucket.ready, bucket.work = 0, None
        if self.find_unused_parameters:
            self._forget_unused_gradients()
        self._pending, self._next_launch = False, 0
        self._got_grad.clear()

    def _forget_unused_gradients(self) -> None:
        """A parameter that no rank used gets .grad = None, as on one process."""
        params = list(self._bucket_of)
        used = torch.tensor([p in self._got_grad for p in params], dtype=torch.int32)
        dist.all_reduce(used)
        for param, count in zip(params, used.tolist()):
            if count == 0:
                param.grad = None


def accumulate(model, micro_batches) -> None:
    """Gradient accumulation with `no_sync` (notebook 04's exercise): one
    backward per micro-batch, each loss divided by their number, and every
    backward but the last inside `model.no_sync()`, so that the gradients
    are all-reduced once, by the last backward, as the mean over the whole
    batch. Works with this module's DDP and with torch's (no_sync in
    torch/nn/parallel/distributed.py).
    """
    for i, x in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (model(x).square().mean() / len(micro_batches)).backward()
