"""How long a learner waits for `ddp_teach.run`, against `torch.multiprocessing.spawn`.

Why: the launcher exists so that re-running a distributed cell feels
interactive. The project issue sets two targets:

* warm run <= 0.3 s median at world 4 (a re-run in a kernel whose fork server
  already imported torch);
* cold run no slower than 1.2x the spawn script (the first run in a new
  kernel, Python start-up and `import torch` included, against the usual
  script that calls `torch.multiprocessing.spawn` and initialises gloo itself).

Every job is the same trivial all-reduce, so what is measured is the launcher.
Cold and spawn repetitions are interleaved (and alternate which goes first) so
that noise on a shared machine hits both alike. Writes
benchmarks/launcher_latency.md (joined into results.md by `make bench`)
and prints the same table.

Run from the repo root: `make bench` (about 2-4 minutes on 2 cores).
"""
import contextlib
import datetime
import inspect
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import ddp_teach as dt
from section import publish

WORLD_SIZES = (2, 4)
WARM_RUNS = 15
COLD_RUNS = 5
SUBPROCESS_TIMEOUT_S = 120
WARM_TARGET_WORLD_SIZE = 4
WARM_TARGET_S = 0.3
COLD_OVER_SPAWN_TARGET = 1.2


def all_reduce_one(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


JOB_SOURCE = inspect.getsource(all_reduce_one)

# What a learner's first cell does in a fresh kernel.
COLD_OURS_SCRIPT = f"""\
import sys
import torch
import torch.distributed as dist
import ddp_teach as dt

{JOB_SOURCE}
world_size = int(sys.argv[1])
assert dt.run(all_reduce_one, world_size) == [float(world_size)] * world_size
"""

# The usual script without ddp_teach: spawn, then rendezvous over TCP.
SPAWN_SCRIPT = f"""\
import socket
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

{JOB_SOURCE}
def spawned_rank(rank, world_size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}",
                            rank=rank, world_size=world_size)
    assert all_reduce_one(rank, world_size) == world_size
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(spawned_rank, args=(world_size, port), nprocs=world_size)
"""


def warm_latencies(world_size: int) -> list[float]:
    """Seconds per `dt.run` in this process, after one warm-up run."""
    dt.run(all_reduce_one, world_size)
    latencies = []
    for _ in range(WARM_RUNS):
        started = time.perf_counter()
        result = dt.run(all_reduce_one, world_size)
        latencies.append(time.perf_counter() - started)
        assert result == [float(world_size)] * world_size, result
    return latencies


def timed_script(script_path: str, world_size: int) -> float:
    """Wall seconds of `python script world_size` in a fresh process."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, script_path, str(world_size)],
                             env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(child.pid, signal.SIGKILL)  # the script and its workers
        child.communicate()
        raise RuntimeError(f"{script_path} {world_size} ran past "
                           f"{SUBPROCESS_TIMEOUT_S} s") from None
    elapsed = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"{script_path} {world_size} exited with "
                           f"{child.returncode}:\n{out}{err}")
    return elapsed


def cold_and_spawn_latencies(workdir: str) -> dict:
    """{(kind, world_size): [seconds, ...]} for kind 'cold' and 'spawn'."""
    scripts = {"cold": os.path.join(workdir, "cold_ours.py"),
               "spawn": os.path.join(workdir, "spawn_baseline.py")}
    for kind, source in (("cold", COLD_OURS_SCRIPT), ("spawn", SPAWN_SCRIPT)):
        with open(scripts[kind], "w") as f:
            f.write(source)
    latencies = {(kind, n): [] for kind in scripts for n in WORLD_SIZES}
    for repetition in range(COLD_RUNS):
        order = ("cold", "spawn") if repetition % 2 == 0 else ("spawn", "cold")
        for world_size in WORLD_SIZES:
            for kind in order:
                latencies[kind, world_size].append(
                    timed_script(scripts[kind], world_size))
    return latencies


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def report(warm: dict, cold_and_spawn: dict) -> str:
    """The results as markdown: facts, table, targets, method."""
    rows, cold_ratios = [], {}
    for n in WORLD_SIZES:
        warm_s = statistics.median(warm[n])
        cold_s = statistics.median(cold_and_spawn["cold", n])
        spawn_s = statistics.median(cold_and_spawn["spawn", n])
        cold_ratios[n] = cold_s / spawn_s
        rows.append(f"| {n} | {warm_s:.3f} | {cold_s:.2f} | {spawn_s:.2f} | "
                    f"{cold_ratios[n]:.2f} | {spawn_s / warm_s:.1f}x |")
    warm_target_s = statistics.median(warm[WARM_TARGET_WORLD_SIZE])
    cold_lines = [f"- cold / spawn <= {COLD_OVER_SPAWN_TARGET} at world {n}: "
                  f"{cold_ratios[n]:.2f} -> "
                  f"**{verdict(cold_ratios[n] <= COLD_OVER_SPAWN_TARGET)}**"
                  for n in WORLD_SIZES]
    return "\n".join([
        "# Launcher latency: `ddp_teach.run` vs `torch.multiprocessing.spawn`",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {len(os.sched_getaffinity(0))} usable CPU cores "
        f"({os.cpu_count()} online), {platform.platform()}",
        f"- python {platform.python_version()}, torch {torch.__version__}",
        f"- repetitions: warm {WARM_RUNS} per world size (after 1 warm-up), "
        f"cold and spawn {COLD_RUNS} each per world size",
        "",
        "Medians, seconds. Job: each rank all-reduces `torch.ones(1)`.",
        "",
        "| world size | warm median s | cold median s | spawn median s "
        "| cold/spawn | spawn/warm |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "## Targets (from the project issue)",
        "",
        f"- warm <= {WARM_TARGET_S} s median at world {WARM_TARGET_WORLD_SIZE}: "
        f"{warm_target_s:.3f} s -> **{verdict(warm_target_s <= WARM_TARGET_S)}**",
        *cold_lines,
        "",
        "## Method",
        "",
        "*Warm*: in one process, after one warm-up run, `time.perf_counter()` "
        "around each `dt.run(fn, n)`; the fork server has already imported "
        "torch. *Cold*: wall time of a fresh `python` process running a "
        "script that imports torch and ddp_teach and calls `dt.run` once "
        "(Python start-up, imports, fork-server start and shutdown included), "
        "i.e. the first run in a new kernel. *Spawn*: wall time of a fresh "
        "`python` process running the usual script: `mp.spawn` of the same "
        "function, each rank calling `init_process_group('gloo', "
        "init_method='tcp://127.0.0.1:PORT')` on a free port. Both scripts "
        "run with `GLOO_SOCKET_IFNAME=lo`. Cold and spawn repetitions are "
        "interleaved, alternating which goes first, so machine noise hits "
        "both alike. Medians, since the machine is shared and noisy.",
        "",
    ])


def main() -> None:
    warm = {n: warm_latencies(n) for n in WORLD_SIZES}
    dt.shutdown()  # no idle fork server during the subprocess runs
    with tempfile.TemporaryDirectory(prefix="launcher-latency-") as workdir:
        cold_and_spawn = cold_and_spawn_latencies(workdir)
    markdown = report(warm, cold_and_spawn)
    publish("launcher_latency.md", markdown)


if __name__ == "__main__":
    main()
