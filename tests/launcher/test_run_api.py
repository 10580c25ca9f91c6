"""The `dt.run` contract (README, "Running your own code on workers"): what a
learner's function may be, what comes back, and what the workers see."""
import linecache
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach import launcher
from ddp_teach.system import threads_per_rank

SCALE = 10  # a module global that workers must be able to read


def sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def test_returns_one_value_per_rank_in_rank_order_and_equals_a_plain_list():
    result = dt.run(lambda rank, world_size: rank * 10, 4)
    assert result == [0, 10, 20, 30]  # a RunResult compares as a list
    assert isinstance(result, dt.RunResult) and isinstance(result, list)
    assert result.timeline is None and result.wall_s > 0
    assert result.backend == "gloo"


def test_process_group_is_ready_and_all_reduce_sums_over_ranks():
    assert dt.run(sum_of_ranks, 4) == [10.0] * 4  # 1+2+3+4 on every rank


def test_world_size_one_works():
    assert dt.run(sum_of_ranks, 1) == [1.0]


def test_closures_globals_args_and_kwargs_reach_the_workers():
    offset = 5  # captured by the closure

    def work(rank, world_size, a, b=0):
        return rank * SCALE + offset + a + b

    assert dt.run(work, 2, args=(100,), kwargs={"b": 1000}) == [1105, 1115]


def test_tensors_and_nested_structures_come_back():
    result = dt.run(lambda r, w: {"rank": r, "t": torch.full((2,), float(r))}, 2)
    assert result[1]["rank"] == 1
    assert torch.equal(result[1]["t"], torch.tensor([1.0, 1.0]))


def test_workers_see_torchrun_environment_variables():
    def env(rank, world_size):
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ[k] for k in keys}

    result = dt.run(env, 3)
    for rank, seen in enumerate(result):
        assert seen["RANK"] == seen["LOCAL_RANK"] == str(rank)
        assert seen["WORLD_SIZE"] == "3" and seen["MASTER_ADDR"] == "127.0.0.1"
        assert int(seen["MASTER_PORT"]) > 0
    assert len({seen["MASTER_PORT"] for seen in result}) == 1


def test_env_argument_is_set_in_workers():
    result = dt.run(lambda r, w: os.environ["MY_FLAG"], 2, env={"MY_FLAG": "on"})
    assert result == ["on", "on"]


def usable_cores() -> int:
    """The cores this process may run on, on any system: Python 3.13's
    process_cpu_count, else the affinity mask (Linux), else every core
    (macOS and Windows before 3.13)."""
    if hasattr(os, "process_cpu_count"):
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def test_each_worker_uses_its_share_of_the_cores():
    result = dt.run(lambda r, w: torch.get_num_threads(), 2)
    assert result == [threads_per_rank(2)] * 2
    assert threads_per_rank(2) == max(1, usable_cores() // 2)


def test_every_run_is_a_fresh_process_from_one_warm_server():
    def mark(rank, world_size):
        seen_before = hasattr(torch, "_ddp_teach_marker")
        torch._ddp_teach_marker = True  # would leak if processes were reused
        return os.getpid(), seen_before, dist.is_initialized()

    first = dt.run(mark, 2)
    server_pid = launcher.current_fork_server().pid
    second = dt.run(mark, 2)
    assert launcher.current_fork_server().pid == server_pid  # the server is reused ...
    assert {p for p, _, _ in first}.isdisjoint({p for p, _, _ in second})
    assert not any(seen for _, seen, _ in first + second)  # ... no state leaks
    assert all(ready for _, _, ready in second)


def test_everything_the_run_opens_listens_on_loopback_only():
    def listening(rank, world_size):
        import psutil
        dist.barrier()
        addrs = [c.laddr.ip for c in psutil.Process().net_connections("inet")
                 if c.status == "LISTEN"]
        dist.barrier()
        return addrs

    import psutil
    result = dt.run(listening, 2)
    assert all(result), "gloo should listen on some address"
    assert {ip for addrs in result for ip in addrs} == {"127.0.0.1"}
    # the kernel's rendezvous store, checked directly:
    store, port = launcher.launch.kernel_store(5.0)
    mine = [c.laddr for c in psutil.Process().net_connections("inet")
            if c.status == "LISTEN" and c.laddr.port == port]
    del store
    assert [addr.ip for addr in mine] == ["127.0.0.1"]


def test_a_dead_fork_server_is_replaced_on_the_next_run():
    dt.run(sum_of_ranks, 2)
    launcher.current_fork_server().process.kill()
    launcher.current_fork_server().process.wait()
    assert dt.run(sum_of_ranks, 2) == [3.0, 3.0]


@pytest.mark.parametrize("world_size, error", [
    (0, ValueError), (65, ValueError), (-1, ValueError),
    (2.0, TypeError), (True, TypeError), ("2", TypeError)])
def test_bad_world_size_is_refused_before_spawning(world_size, error):
    with pytest.raises(error, match="world_size"):
        dt.run(sum_of_ranks, world_size)


@pytest.mark.parametrize("timeout, error", [
    (0, ValueError), (-1.0, ValueError), (math.nan, ValueError),
    (math.inf, ValueError), ("5", TypeError)])
def test_bad_timeout_is_refused(timeout, error):
    with pytest.raises(error, match="timeout"):
        dt.run(sum_of_ranks, 2, timeout=timeout)


def test_fn_must_be_callable_and_accept_rank_and_world_size():
    with pytest.raises(TypeError, match="fn must be a function"):
        dt.run(42, 2)
    with pytest.raises(TypeError, match=r"fn\(rank, world_size"):
        dt.run(lambda rank: rank, 2)


def test_bad_args_kwargs_env_and_backend_are_refused():
    with pytest.raises(TypeError, match="args=\\(x,\\)"):
        dt.run(sum_of_ranks, 2, args=5)
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        dt.run(sum_of_ranks, 2, kwargs=[1])
    with pytest.raises(TypeError, match="env must be a dict of str"):
        dt.run(sum_of_ranks, 2, env={"A": 1})
    with pytest.raises(ValueError, match="backend must be one of"):
        dt.run(sum_of_ranks, 2, backend="mpi")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_nccl_without_gpus_is_a_value_error_before_anything_starts():
    launcher.shutdown()
    with pytest.raises(ValueError, match="needs one CUDA GPU per rank.*has 0"):
        dt.run(sum_of_ranks, 2, backend="nccl")
    assert launcher.current_fork_server() is None  # nothing was spawned, not even the server


def test_unpicklable_argument_is_named():
    import threading
    lock = threading.Lock()
    with pytest.raises(TypeError, match="positional argument 0 in args.*lock"):
        dt.run(lambda r, w, x: r, 2, args=(lock,))


def test_unpicklable_captured_variable_is_named():
    import threading
    guard = threading.Lock()
    with pytest.raises(TypeError, match="variable 'guard'"):
        dt.run(lambda r, w: guard.locked(), 2)


def test_unpicklable_return_value_is_a_worker_error_naming_rank_and_type():
    def give_generator(rank, world_size):
        return (i for i in range(3)) if rank == 1 else rank

    with pytest.raises(dt.WorkerError, match="rank 1 returned a generator") as err:
        dt.run(give_generator, 2)
    assert err.value.first_rank == 1


def test_the_largest_world_size_runs():
    assert dt.run(sum_of_ranks, 64, timeout=120) == [64 * 65 / 2] * 64


def test_instant_functions_never_race_the_connection_setup():
    """A rank that returns at once must not exit while a peer is still
    connecting to it (gloo: 'Connection closed by peer'); seen about 1 run
    in 60 at world 4 on a loaded machine before the launcher's barrier."""
    for _ in range(20):
        assert dt.run(lambda rank, world_size: rank, 4) == [0, 1, 2, 3]


CELLS = "/nonexistent-ddp-teach-cells/"  # a notebook's cells, as linecache has them
SEEN_CELLS = '''def seen_cells(rank, world_size):
    import linecache
    return sorted(n for n in linecache.cache if n.startswith(CELLS))
'''


def test_a_run_ships_only_the_cells_its_code_comes_from(monkeypatch):
    def add_cell(name, source):
        monkeypatch.setitem(linecache.cache, name, (
            len(source), None, source.splitlines(True), name))

    for i in range(50):  # cells run earlier, which the job does not use
        add_cell(f"{CELLS}unused-{i}.py", "x = 1\n" * 100)
    used = f"{CELLS}used.py"
    add_cell(used, SEEN_CELLS)
    namespace = {"CELLS": CELLS}
    exec(compile(SEEN_CELLS, used, "exec"), namespace)
    assert dt.run(namespace["seen_cells"], 1) == [[used]]


def test_the_readme_warns_that_local_users_can_reach_the_rendezvous_store():
    from datetime import timedelta
    store, port = launcher.launch.kernel_store(5.0)
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False,
                             timeout=timedelta(seconds=5))
    stranger.set("planted", "by anyone on this host")  # no credentials asked
    assert store.get("planted") == b"by anyone on this host"
    del stranger, store
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    notes = readme.split("## Troubleshooting")[1]
    for fact in ("no authentication", "any user of this machine", "_object",
                 "unpickle"):
        assert fact in notes, f"the security note should mention {fact!r}"
