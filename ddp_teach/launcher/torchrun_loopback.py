"""torch's own `torchrun`, with its stores listening on 127.0.0.1 only.

`dt.scripts.torchrun` runs this file instead of the `torchrun` command; it
takes the same arguments and runs `torch.distributed.run.main`, unchanged
but for two things. A torchrun agent hosts two `TCPStore` servers (the c10d
rendezvous store, and the store its workers' `init_process_group` meets
in), and a TCPStore server listens on every network interface whatever
host name it is given. On a cluster that is what you want; on a laptop it
opens two ports to the network for the length of a run, which this
course never does. So here a store server is handed a socket already
bound to 127.0.0.1 (`master_listen_fd`, as `dt.run` does), and
`--local-addr 127.0.0.1` makes workers look for their store there.

The second fixes a torch 2.13 bug that elastic restarts hit: the
agent keeps one workers' store for the whole job, so a restarted group
can read the addresses the previous attempt's workers left in it, and
gloo fails with "connectFullMesh failed ... Connection refused" (pytorch
issue #135712). Here each rendezvous round starts a fresh store, as the
fix for that issue intended. With the `torchrun` command itself, set
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 instead (rank 0's worker then hosts
a new store for each attempt, listening on every interface); here that
variable is ignored, so that no worker ever hosts a store.

Run by path, not with `-m`, so that starting it does not import the whole
`ddp_teach` package (torch alone takes seconds to import).
"""
import ctypes
import os
import signal
import socket
import sys
from datetime import timedelta

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(
        os.path.abspath(__file__)):
    del sys.path[0]  # our modules must not shadow top-level ones

import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.rendezvous import (  # noqa: E402
    c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous)


class LoopbackTCPStore(dist.TCPStore):
    """A TCPStore whose server, if it hosts one, listens on 127.0.0.1."""

    def __init__(self, host_name, port, world_size=None, is_master=False,
                 timeout=timedelta(seconds=300), wait_for_workers=True,
                 multi_tenant=False, master_listen_fd=None, use_libuv=True):
        if is_master and master_listen_fd is None:
            try:
                listener = socket.create_server(("127.0.0.1", port),
                                                backlog=128)
            except OSError as exc:  # torchrun's fallback (another agent on
                # this machine hosts the store) expects a RuntimeError
                raise RuntimeError(f"cannot listen on 127.0.0.1:{port}: "
                                   f"{exc}") from exc
            port = listener.getsockname()[1]
            master_listen_fd = listener.detach()
        super().__init__(host_name, port, world_size, is_master, timeout,
                         wait_for_workers, multi_tenant, master_listen_fd,
                         use_libuv)


def _fresh_store_each_round(next_rendezvous):
    def wrapper(self):
        self._bootstrap_store_info = None
        self._shared_tcp_store_server = None
        return next_rendezvous(self)
    return wrapper


def main() -> None:
    if sys.platform.startswith("linux"):  # the notebook's kernel died: stop,
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # and stop the workers
    os.environ.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    dist.TCPStore = LoopbackTCPStore
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore
    static_tcp_rendezvous.TCPStore = LoopbackTCPStore
    handler = dynamic_rendezvous.DynamicRendezvousHandler
    handler.next_rendezvous = _fresh_store_each_round(handler.next_rendezvous)
    if not any(a.split("=")[0] in ("--local-addr", "--local_addr")
               for a in sys.argv[1:]):
        sys.argv[1:1] = ["--local-addr", "127.0.0.1"]
    from torch.distributed.run import main as torchrun_main
    torchrun_main()


if __name__ == "__main__":
    main()
