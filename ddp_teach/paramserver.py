"""A parameter server on `torch.distributed.rpc`: the other way to share work.

Before all-reduce took over, data-parallel training was organised around a
*parameter server* (Li et al., "Scaling Distributed Machine Learning with the
Parameter Server", OSDI 2014; Dean et al.'s DistBelief, NeurIPS 2012): one
process holds the parameters and the optimizer; workers *pull* the
parameters, compute gradients on their own batch, and *push* the gradients
back; the server applies them. There is no collective: every message is a
remote procedure call between one worker and the server.

`torch.distributed.rpc` (https://pytorch.org/docs/stable/rpc.html) gives
exactly that: `rpc_sync(to, fn, args)` runs `fn(*args)` in process `to` and
returns the result. The function travels *by name*, as pickle sends
functions, so the callee must be able to import it: the targets below are
module-level functions of this module, and a function defined in a notebook
cell cannot be one. The parameters and the gradients travel as tensors.

Two update rules. `sync_update` waits until every worker has pushed, then
averages and steps: the same arithmetic as DDP, so both train to the same
parameters. `async_update` steps on every push, with gradients that may have
been computed on parameters several versions old ("staleness"), so that no
worker ever waits for another.

The cost that made all-reduce win: every worker's gradients go *into* the
server and every worker's parameters come *out* of it, so the server's link
carries 2 x workers x model bytes per step, while a ring all-reduce sends
about 2 x model bytes per rank whatever the number of ranks.

torch for Windows is built without RPC, so `torch.distributed.rpc` is
imported where it is used, not when this module is: the package imports on
every platform, and starting RPC where there is none says so.
"""
import os
import sys
import threading
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_teach import tracing
from ddp_teach.tracing import COMM
from ddp_teach.system import loopback_interface

SERVER = "server"
_server = None  # this process's ParameterServer (on the server rank only)


def worker_name(rank: int) -> str:
    """RPC names in a parameter-server run: "server" for rank 0, then
    "worker1", "worker2", ..."""
    return SERVER if rank == 0 else f"worker{rank}"


def rpc_module():
    """`torch.distributed.rpc`, or a RuntimeError saying that this torch has
    no RPC (torch for Windows, builds without distributed) and what to do."""
    try:
        import torch.distributed.rpc as rpc
    except ImportError as missing:
        raise _no_rpc(f"importing torch.distributed.rpc failed: {missing}") from missing
    if not rpc.is_available():
        raise _no_rpc("torch.distributed.rpc.is_available() is False")
    return rpc


def _no_rpc(why: str) -> RuntimeError:
    return RuntimeError(
        f"The parameter server needs torch.distributed.rpc, which this torch "
        f"({torch.__version__} on {sys.platform}) does not have: {why}. torch "
        f"for Windows is built without RPC; run this part of the course on "
        f"Linux or macOS (on Windows: inside WSL2).")


def start_rpc(rank: int, world_size: int, name: str | None = None,
              timeout: float = 60.0) -> str:
    """`rpc.init_rpc` for a process started by `dt.run` (or torchrun).

    RPC needs a rendezvous store of its own. Under torchrun the launcher
    serves one and workers join it as clients (TORCHELASTIC_USE_AGENT_STORE);
    `dt.run` serves its store from the kernel on 127.0.0.1 the same way, so
    we say so. TensorPipe's listening socket is pinned to the loopback
    interface and to its plain TCP transport, so nothing listens on any
    other address. Returns this process's RPC name (default "rank{rank}").
    """
    rpc = rpc_module()
    name = f"rank{rank}" if name is None else name
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ.setdefault("TP_SOCKET_IFNAME", loopback_interface())
    options = rpc.TensorPipeRpcBackendOptions(
        init_method="env://", rpc_timeout=timeout, _transports=["uv"],
        _channels=["basic"])
    with warnings.catch_warnings():  # torch's own use of a deprecated API
        warnings.filterwarnings("ignore", "You are using a Backend")
        rpc.init_rpc(name, rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    return name


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ParameterServer:
    """The parameters, the optimizer, and what the update rule needs.

    `update(server, grads) -> bool` is called once per push, under a lock;
    it returns True when it took an optimizer step. Fields it may use:
    `params` (the model's parameters), `optimizer` (SGD over them),
    `num_workers`, and for `sync_update` the accumulator `pending` (zeros
    like each parameter) and the count `pushes`. The server itself counts
    `version` (steps taken) and answers the pushes that wait for a step.
    """

    def __init__(self, model, num_workers: int, lr: float, update=None):
        self.params = list(model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=lr)
        self.num_workers = num_workers
        self.update = sync_update if update is None else update
        self.pending = [torch.zeros_like(p) for p in self.params]
        self.pushes = 0
        self.version = 0
        self.staleness: list[int] = []  # versions behind, per push
        self.bytes_in = self.bytes_out = 0
        self._lock = threading.Lock()
        self._waiting: list[torch.futures.Future] = []

    def pull(self):
        """(version, a copy of every parameter)."""
        with self._lock:
            params = [p.detach().clone() for p in self.params]
            self.bytes_out += tensor_bytes(params)
            return self.version, params

    def push(self, version: int, grads) -> torch.futures.Future:
        """Apply one worker's gradients; the future completes (with the new
        version) once the update rule has stepped with them."""
        future = torch.futures.Future()
        with self._lock:
            self.staleness.append(self.version - version)
            self.bytes_in += tensor_bytes(grads)
            self._waiting.append(future)
            with tracing.span("update"):
                stepped = self.update(self, grads)
            released = []
            if stepped:
                self.version += 1
                released, self._waiting = self._waiting, []
        for waiting in released:
            waiting.set_result(self.version)
        return future

    def state(self) -> dict:
        """What the server returns to the notebook at the end."""
        return {"params": [p.detach().clone() for p in self.params],
                "version": self.version, "staleness": list(self.staleness),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


def sync_update(server, grads) -> bool:
    """Synchronous SGD: add the pushed gradients to the accumulator; once
    every worker has pushed, step with their AVERAGE (what DDP computes),
    clear the accumulator and the count, and say that we stepped."""
    for total, grad in zip(server.pending, grads):
        total += grad
    server.pushes += 1
    if server.pushes < server.num_workers:
        return False
    for param, total in zip(server.params, server.pending):
        param.grad = total / server.num_workers
    server.optimizer.step()
    for total in server.pending:
        total.zero_()
    server.pushes = 0
    return True


def async_update(server, grads) -> bool:
    """Asynchronous SGD (Downpour / Hogwild style): step with every push as
    it comes, even if it was computed on older parameters."""
    for param, grad in zip(server.params, grads):
        param.grad = grad
    server.optimizer.step()
    return True


def _async_execution(fn):
    """torch's `rpc.functions.async_execution`: the server answers an RPC to
    `fn` when the future `fn` returns completes, not when `fn` returns. That
    decorator lives in a module of plain Python that imports where RPC is
    missing too; where even that fails, `fn` stays undecorated, and
    `start_rpc` (needed before any RPC) says why RPC cannot run."""
    try:
        from torch.distributed.rpc.functions import async_execution
    except ImportError:
        return fn
    return async_execution(fn)


def _pull():  # RPC targets: run on the server, found there by name
    return _server.pull()


@_async_execution
def _push(version, grads):
    return _server.push(version, grads)


def _work(rank, make_model, batch_fn, steps, loss_fn, delay_s):
    """A worker's loop: pull, compute gradients on its batch, push."""
    rpc = rpc_module()
    model = make_model()
    losses = []
    for step in range(steps):
        # RPCs are not torch.distributed calls: the tracer does not see them
        # unless they are marked as communication
        with tracing.span("pull", COMM) as pull:
            version, params = rpc.rpc_sync(SERVER, _pull)
            pull.nbytes = tensor_bytes(params)
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                p.copy_(value)
        x, y = batch_fn(rank - 1, step)
        with tracing.span("compute"):  # no communication inside
            model.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
        if delay_s:
            with tracing.span("straggling"):
                time.sleep(delay_s)  # a slower worker, when asked
        grads = [p.grad for p in model.parameters()]
        with tracing.span("push", COMM, nbytes=tensor_bytes(grads)):
            rpc.rpc_sync(SERVER, _push, args=(version, grads))
        losses.append(loss.item())
    return losses


def train(rank, world_size, make_model, batch_fn, steps, lr, update=None,
          loss_fn=F.mse_loss, delays=None):
    """Run inside `dt.run`: rank 0 serves, ranks 1.. are workers.

    `make_model()` builds the model (the same on every rank);
    `batch_fn(worker, step) -> (x, y)` is worker `worker`'s batch (worker =
    rank - 1, so that worker i reads what DDP's rank i reads); `update` is
    the server's rule (`sync_update` by default); `delays` maps a rank to
    extra seconds per step, to make it a straggler. Returns the server's
    `state()` on rank 0 and each worker's losses on the others.
    """
    global _server
    if rank == 0:  # before init_rpc: no push can arrive before it exists
        _server = ParameterServer(make_model(), world_size - 1, lr, update)
    start_rpc(rank, world_size, worker_name(rank))
    try:
        losses = None if rank == 0 else _work(
            rank, make_model, batch_fn, steps, loss_fn,
            (delays or {}).get(rank, 0.0))
    except BaseException:
        rpc_module().shutdown(graceful=False)  # the others may wait for us forever:
        raise                         # fail now, and let dt.run stop them
    rpc_module().shutdown()  # graceful: waits until every rank is done
    return _server.state() if rank == 0 else losses


def ddp_train(rank, world_size, make_model, batch_fn, steps, lr,
              loss_fn=F.mse_loss):
    """The same training with the course's DDP (`dt.ddp`, equal to torch's
    and quicker to start), for comparison: returns (final parameters,
    losses) from every rank."""
    from ddp_teach.ddp import DistributedDataParallel
    module = tracing.trace_layers(make_model())
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    model = DistributedDataParallel(module)
    dist.barrier()  # a traced run's steps start here on every rank
    losses = []
    for step in range(steps):
        x, y = batch_fn(rank, step)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        with tracing.span("step"):
            optimizer.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses
