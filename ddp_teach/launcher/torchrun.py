"""Run torchrun from a notebook: live output, a timeout, nothing left behind.

`torchrun(script, nproc_per_node=2)` is `torchrun --standalone`;
`nnodes=2` starts one torchrun per "node", all on this machine, meeting
through a c10d rendezvous on 127.0.0.1, as two machines of a cluster
would. Each torchrun is torch's own (`torchrun_loopback.py`: the same
program, with its stores on 127.0.0.1). What a notebook needs on top:

- output as it comes, each line prefixed `[node i]` when there are several
  (torchrun's `--tee 3` adds `[default<local rank>]:` per worker line);
- a timeout after which every process is killed, workers included: they
  run in sessions of their own, so a signal to torchrun's process group
  misses them; the whole tree is collected first, then killed;
- each rank's return value, saved by an exported script (`--out DIR`).
"""
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RUNNER = str(Path(__file__).with_name("torchrun_loopback.py"))


@dataclass
class TorchrunResult:
    """How a torchrun job went: one entry per node (torchrun process)."""
    commands: list[str]
    returncodes: list[int]
    output: str
    wall_s: float
    timed_out: bool = False
    values: list = field(default_factory=list)  # per rank, from --out

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(c == 0 for c in self.returncodes)


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1 (racy, but only by a
    moment: torchrun's rendezvous needs a port number before it starts)."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def torchrun(script, *script_args, nproc_per_node=2, nnodes=1,
             max_restarts=0, results=True, env=None, timeout=60.0,
             echo=True) -> TorchrunResult:
    """Run `script` under torchrun: one torchrun per node, on this machine.

    nnodes=1 is `torchrun --standalone`; nnodes>1 starts one torchrun per
    "node" with a c10d rendezvous on 127.0.0.1. results=True passes
    `--out DIR` and reads each rank's DIR/rank{r}.pt into `.values`.
    """
    flags = [f"--nproc-per-node={nproc_per_node}", "--tee=3",
             f"--max-restarts={max_restarts}"]
    if nnodes == 1:
        flags.insert(0, "--standalone")
    else:
        flags[:0] = [f"--nnodes={nnodes}", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                     f"--rdzv-id={uuid.uuid4().hex[:8]}"]
    command = ["torchrun", *flags, str(script), *map(str, script_args)]
    return run_commands([command] * nnodes, env=env, timeout=timeout,
                        echo=echo, results=results,
                        world_size=nnodes * nproc_per_node)


def run_commands(commands, *, env=None, node_envs=None, cwd=None,
                 timeout=60.0, echo=True, results=False,
                 world_size=None, labels=None) -> TorchrunResult:
    """Run one command per node at once, prefix their output (`[node i]`,
    or `[labels[i]]`), kill them all after `timeout` s. A leading `torchrun` is our loopback torchrun, its
    log files kept in a scratch folder that is removed afterwards."""
    from ddp_teach.launcher.procs import require_posix
    from ddp_teach.system import loopback_interface, threads_per_rank
    require_posix("Running torchrun from a notebook")
    scratch = tempfile.mkdtemp(prefix="torchrun-")
    out_dir = os.path.join(scratch, "out")
    os.mkdir(out_dir)
    base = {**os.environ, **(env or {})}
    base.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    if world_size:  # each worker's share of the cores, as dt.run gives it
        base.setdefault("OMP_NUM_THREADS", str(threads_per_rank(world_size)))
    procs, lines, timed_out = [], [], False
    started = time.monotonic()
    try:
        for node, command in enumerate(commands):
            argv = list(command) + (["--out", out_dir] if results else [])
            if argv[0] == "torchrun":
                argv[:1] = [sys.executable, RUNNER,
                            f"--log-dir={os.path.join(scratch, 'logs')}"]
            procs.append(subprocess.Popen(
                argv, env={**base, **(node_envs[node] if node_envs else {})},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd))
        deadline = started + timeout
        prefixes = ([f"[{label}] " for label in labels] if labels else
                    [f"[node {i}] " if len(procs) > 1 else "" for i in range(len(procs))])
        lines, timed_out = _pump(procs, prefixes, deadline, echo)
        for proc in procs if not timed_out else ():
            try:  # its output has closed, but it may still be exiting
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
        values = _read_values(out_dir, world_size) if results else []
    finally:
        for proc in procs:  # no-op for those that ended by themselves
            _kill_tree(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    return TorchrunResult([" ".join(map(str, c)) for c in commands],
                          [p.returncode for p in procs], "".join(lines),
                          time.monotonic() - started, timed_out, values)


def _read_values(out_dir, world_size) -> list:
    """Each rank's saved return value (None where a rank saved nothing)."""
    import torch
    paths = [os.path.join(out_dir, f"rank{rank}.pt")
             for rank in range(world_size or 0)]
    # our own files, just written by the script we ran: safe to unpickle
    return [torch.load(p, weights_only=False) if os.path.exists(p) else None
            for p in paths]


def _pump(procs, prefixes, deadline, echo):
    """Show each process's lines as they come, each after its prefix, until
    all end or time's up."""
    selector, lines, partial = selectors.DefaultSelector(), [], {}
    for proc, prefix in zip(procs, prefixes):
        selector.register(proc.stdout, selectors.EVENT_READ, prefix)
        partial[proc.stdout] = b""

    def emit(prefix, raw):
        lines.append(prefix + raw.decode(errors="replace"))
        if echo:
            print(lines[-1], end="", flush=True)

    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                emit("", b"*** timed out: every process of the job was "
                         b"killed\n")
                return lines, True
            for key, _ in selector.select(min(remaining, 0.5)):
                chunk = os.read(key.fileobj.fileno(), 65536)
                *complete, partial[key.fileobj] = (partial[key.fileobj]
                                                   + chunk).split(b"\n")
                for raw in complete:
                    emit(key.data, raw + b"\n")
                if not chunk:  # the process closed its output
                    if partial[key.fileobj]:
                        emit(key.data, partial[key.fileobj] + b"\n")
                    selector.unregister(key.fileobj)
        return lines, False
    finally:
        selector.close()


def _kill_tree(proc) -> None:
    """Stop a torchrun and every worker it started, and reap it."""
    if proc.poll() is None:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        proc.terminate()  # torchrun forwards SIGTERM to its workers
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            proc.kill()
    proc.wait()
    proc.stdout.close()
