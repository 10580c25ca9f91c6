"""The torch and Python the learner has: clear messages outside the known-good
range, shims that make an older torch speak torch 2.13's names, and a
package that imports on Windows and starts its fork server right on macOS.

Whether the unit tests pass under another torch is `make test-versions`
(tools/check_other_versions.py), not this file: it builds environments."""
import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach import compat
from ddp_teach.launcher import forkserver

ROOT = Path(__file__).resolve().parents[1]
FIX = f'{sys.executable} -m pip install "{compat.torch_requirement()}"'
OLDEST = "{}.{}".format(*compat.TORCH_OLDEST)


@pytest.fixture
def not_yet_warned(monkeypatch):
    """As in a fresh session: no untested-version warning shown yet."""
    monkeypatch.setenv(compat.WARNED_ENV, "")


def test_the_known_good_range_is_what_the_pip_command_asks_for():
    oldest, newest = compat.TORCH_OLDEST, compat.TORCH_NEWEST
    assert compat.torch_requirement() == (
        f"torch>={oldest[0]}.{oldest[1]},<{newest[0]}.{newest[1] + 1}")
    assert compat.PYTHON_OLDEST <= sys.version_info[:2] <= compat.PYTHON_NEWEST


@pytest.mark.parametrize("text, pair", [("2.6.0+cu124", (2, 6)), ("2.13.0", (2, 13)),
                                        ("2.14.0a0+git1f2e3d", (2, 14)),
                                        ("3.12.1", (3, 12))])
def test_version_numbers_are_read_from_release_local_and_dev_strings(text, pair):
    assert compat.version_tuple(text) == pair


def test_a_version_string_without_a_number_is_refused_clearly():
    with pytest.raises(ValueError, match="'unknown'"):
        compat.version_tuple("unknown")


def test_too_old_torch_names_the_version_the_python_and_the_fix(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    with pytest.raises(ImportError) as error:
        compat.check_versions()
    message = str(error.value)
    assert f"torch {OLDEST} or newer" in message and "torch 2.4.1+cu121" in message
    assert sys.executable in message and FIX in message
    assert "%pip install" in message and "restart" in message


def test_the_oldest_and_newest_known_good_torch_pass_silently(not_yet_warned):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for version in (compat.TORCH_OLDEST, compat.TORCH_NEWEST):
            compat.check_torch(f"{version[0]}.{version[1]}.0")


def test_too_new_torch_warns_once_with_the_version_the_python_and_the_fix(
        monkeypatch, not_yet_warned):
    newer = f"{compat.TORCH_NEWEST[0]}.{compat.TORCH_NEWEST[1] + 1}.0"
    monkeypatch.setattr(torch, "__version__", newer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compat.check_versions()
        compat.check_versions()  # a second import, or a child process
    assert [w.category for w in caught] == [compat.UntestedVersionWarning]
    message = str(caught[0].message)
    assert f"torch {newer}" in message and sys.executable in message
    assert FIX in message and "probably work" in message


def test_too_old_python_names_the_version_the_python_and_the_fix(monkeypatch):
    monkeypatch.setattr(compat.platform, "python_version", lambda: "3.10.12")
    with pytest.raises(ImportError) as error:
        compat.check_versions()
    message = str(error.value)
    assert "Python 3.11 or newer" in message and "Python 3.10.12" in message
    assert sys.executable in message and "-m venv .venv" in message
    assert "pip install -e ." in message and "environment.yml" in message


def test_too_new_python_warns_with_the_version_the_python_and_the_fix(
        monkeypatch, not_yet_warned):
    monkeypatch.setattr(compat.platform, "python_version", lambda: "3.14.0")
    with pytest.warns(compat.UntestedVersionWarning) as caught:
        compat.check_versions()
    message = str(caught[0].message)
    assert "Python 3.14.0" in message and sys.executable in message
    assert "python3.13 -m venv .venv" in message


def test_no_torch_at_all_says_how_to_install_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    with pytest.raises(ImportError) as error:
        compat.check_versions()
    assert "has none" in str(error.value) and FIX in str(error.value)


def test_importing_the_package_with_too_old_a_torch_fails_with_the_message():
    script = ("import torch\ntorch.__version__ = '2.2.2'\n"
              "try:\n    import ddp_teach\nexcept ImportError as e:\n"
              "    print(e)\nelse:\n    print('imported')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert f"needs torch {OLDEST} or newer" in done.stdout, done.stdout + done.stderr
    assert "torch 2.2.2" in done.stdout


def old_names_only(rank, world_size):
    """On every rank: a namespace with only the pre-2.13 names, given the
    new ones by install_shims; each call must reach the old function with
    every argument (op, group, async_op)."""
    import types
    calls = []

    def recorded(function):
        def call(*args):
            calls.append((function.__name__, args[2:]))
            return function(*args)
        return call
    old = types.SimpleNamespace(
        all_gather_into_tensor=recorded(dist.all_gather_into_tensor),
        reduce_scatter_tensor=recorded(dist.reduce_scatter_tensor))
    added = compat.install_shims([old])
    gathered = torch.zeros(2 * world_size)
    old.all_gather_single(gathered, torch.full((2,), float(rank + 1)))
    scattered = torch.zeros(2)
    work = old.reduce_scatter_single(
        scattered, torch.arange(2.0 * world_size) * (rank + 1),
        op=dist.ReduceOp.SUM, group=dist.group.WORLD, async_op=True)
    work.wait()
    # an op other than the default reaches the old function too (gloo's
    # reduce_scatter_tensor sums whatever op torch 2.8 gives it, so only
    # the call is checked)
    old.reduce_scatter_single(torch.zeros(2), torch.ones(2 * world_size),
                              dist.ReduceOp.MAX)
    delegated = calls == [
        ("all_gather_into_tensor", (None, False)),
        ("reduce_scatter_tensor", (dist.ReduceOp.SUM, dist.group.WORLD, True)),
        ("reduce_scatter_tensor", (dist.ReduceOp.MAX, None, False))]
    signature = inspect.signature(old.reduce_scatter_single)
    return (added, gathered.tolist(), scattered.tolist(), delegated,
            list(signature.parameters) == list(
                inspect.signature(dist.reduce_scatter_tensor).parameters))


def test_the_shims_delegate_every_argument_to_the_older_names():
    results = dt.run(old_names_only, 2, backend="gloo", timeout=60)
    for rank, (added, gathered, scattered, delegated, same_signature) in enumerate(
            results):
        assert added == ["all_gather_single", "reduce_scatter_single"]
        assert gathered == [1.0, 1.0, 2.0, 2.0]  # rank order
        # the sum over ranks of arange(4) * (rank + 1) is 3 * arange(4):
        # rank r gets chunk r
        assert scattered == [3.0 * (2 * rank), 3.0 * (2 * rank + 1)]
        assert delegated, "every argument, in order, to the old function"
        assert same_signature


def test_this_torch_has_the_2_13_names_after_import():
    assert callable(dist.all_gather_single) and callable(dist.reduce_scatter_single)
    assert compat.install_shims() == [], "installed once, at import"


def buffer_counts(rank, world_size, sync):
    """notebook 03's counter: each forward adds rank + 1 to a buffer."""
    import warnings as warned
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen += rank + 1
            return self.linear(x)
    with warned.catch_warnings(record=True) as caught:
        warned.simplefilter("always")
        model = DistributedDataParallel(
            Counter(), **{compat.DDP_BUFFER_SYNC_ARGUMENT: sync})
    for _ in range(3):
        model(torch.ones(1, 2)).sum().backward()
    return model.module.seen.item(), [str(w.message) for w in caught
                                      if "buffers" in str(w.message)]


@pytest.mark.parametrize("sync, seen", [(True, [3.0, 4.0]), (False, [3.0, 6.0])])
def test_the_buffer_sync_argument_is_the_one_this_torch_takes(sync, seen):
    results = dt.run(buffer_counts, 2, args=(sync,), backend="gloo", timeout=60)
    assert [count for count, _ in results] == seen
    assert all(not warned for _, warned in results), "no deprecation warning"


def test_dt_run_on_native_windows_says_to_use_wsl2(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    before = dt.launcher.current_fork_server()
    with pytest.raises(RuntimeError) as error:
        dt.run(lambda rank, world_size: rank, 2)
    assert "WSL2" in str(error.value) and "win32" in str(error.value)
    assert "dt.run needs Linux or macOS" in str(error.value)
    assert dt.launcher.current_fork_server() is before, "nothing started"


def test_torchrun_from_a_notebook_on_native_windows_says_to_use_wsl2(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(RuntimeError, match="WSL2"):
        dt.scripts.torchrun("train.py")


def test_the_fork_server_disables_objc_fork_safety_on_macos_only(monkeypatch):
    monkeypatch.delenv("OBJC_DISABLE_INITIALIZE_FORK_SAFETY", raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert forkserver.server_env({})["OBJC_DISABLE_INITIALIZE_FORK_SAFETY"] == "YES"
    monkeypatch.setattr(sys, "platform", "linux")
    assert "OBJC_DISABLE_INITIALIZE_FORK_SAFETY" not in forkserver.server_env({})


# What native Windows lacks that the launcher uses: if any of these were
# touched at import, `import ddp_teach` would fail there.
WINDOWS_SIMULATION = """
import importlib, os, pkgutil, select, signal, socket, sys
import torch, torch.distributed, numpy, cloudpickle, psutil, matplotlib.figure
LACKS = {os: ["fork", "getuid", "geteuid", "killpg", "setpgid", "getpgid",
              "setsid", "O_NOFOLLOW", "sched_getaffinity", "WNOHANG", "wait4"],
         signal: ["SIGUSR1", "SIGUSR2", "SIGKILL", "SIGALRM", "SIGQUIT",
                  "SIGHUP", "SIGCHLD", "pthread_kill"],
         socket: ["send_fds", "recv_fds", "AF_UNIX"], select: ["poll", "epoll"]}
for module, names in LACKS.items():
    for name in names:
        if hasattr(module, name):
            delattr(module, name)
for name in ("fcntl", "resource", "pwd", "grp", "termios", "pty"):
    sys.modules[name] = None  # importing them now fails
sys.platform = "win32"
import ddp_teach
failed = []
for info in pkgutil.walk_packages(ddp_teach.__path__, "ddp_teach."):
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
try:
    ddp_teach.run(print, 2)
except RuntimeError as exc:
    failed += [] if "WSL2" in str(exc) else [f"dt.run: {exc}"]
print("\\n".join(failed) or "all imported")
"""


def test_every_module_imports_without_the_posix_calls_windows_lacks():
    done = subprocess.run([sys.executable, "-c", WINDOWS_SIMULATION], cwd=ROOT,
                          text=True, capture_output=True, timeout=240)
    assert done.stdout.strip() == "all imported", done.stdout + done.stderr


def test_gloo_connection_notices_stay_out_of_the_cell_but_in_the_log(tmp_path):
    import io
    from ddp_teach.launcher.output import OutputRouter
    shown = io.StringIO()
    router = OutputRouter(2, str(tmp_path), shown, io.StringIO())
    notice = ("[Gloo] Rank 1 is connected to 1 peer ranks. "
              "Expected number of connected peer ranks is : 1")
    router.feed(1, "out", f"{notice}\nhello\n[Gloo] Rank 1 says hi\n".encode())
    router.close(1, "out")
    router.finish()
    assert shown.getvalue() == "[rank 1] hello\n[rank 1] [Gloo] Rank 1 says hi\n"
    assert (tmp_path / "rank1.log").read_text().startswith(notice + "\nhello\n")


def test_make_test_versions_checks_the_ends_of_the_known_good_range():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "check_other_versions", ROOT / "tools" / "check_other_versions.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    torches = {compat.version_tuple(env.split(":")[1]) for env in tool.DEFAULT_ENVS}
    assert torches == {compat.TORCH_OLDEST, compat.TORCH_NEWEST}
    pythons = {compat.version_tuple(env.split(":")[0]) for env in tool.DEFAULT_ENVS}
    assert compat.PYTHON_OLDEST in pythons


def test_collectives_run_on_meta_tensors_over_the_fake_group_once_registered():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    compat.register_meta_collectives()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        shard, full = torch.empty(3, device="meta"), torch.empty(12, device="meta")
        dist.broadcast(full, src=0)
        dist.all_reduce(full)
        dist.all_gather_single(full, shard)
        dist.reduce_scatter_single(shard, full)
    finally:
        dist.destroy_process_group()
    assert full.shape == (12,) and shard.is_meta


def all_to_all_where_the_list_form_is_refused(rank, world_size):
    def refusing(*args, **kwargs):
        raise RuntimeError("Backend gloo does not support alltoall")
    shimmed = compat.all_to_all_shim(refusing, dist.all_to_all_single)
    sent = [torch.full((2,), 10.0 * rank + peer) for peer in range(world_size)]
    received = [torch.zeros(2) for _ in range(world_size)]
    returned = shimmed(received, sent)
    real = [torch.zeros(2) for _ in range(world_size)]
    dist.all_to_all(real, sent)
    with pytest.raises(RuntimeError, match="does not support"):
        shimmed(received, sent, async_op=True)  # only blocking calls fall back
    return returned, [t.tolist() for t in received], [t.tolist() for t in real]


def test_the_all_to_all_shim_sends_what_the_list_form_sends():
    for returned, received, real in dt.run(
            all_to_all_where_the_list_form_is_refused, 3, backend="gloo", timeout=60):
        assert returned is None and received == real


@pytest.mark.parametrize("torch_version, expected", [
    ((2, 9), ["all_gather_single", "reduce_scatter_single", "all_reduce"]),
    ((2, 13), ["all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"])])
def test_traces_call_the_old_collectives_by_their_2_13_names_before_2_13(
        monkeypatch, torch_version, expected):
    monkeypatch.setattr(compat, "TORCH", torch_version)
    names = ["all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"]
    assert [compat.traced_name(n) for n in names] == expected


def gather_and_scatter(rank, world_size):
    out = torch.empty(2 * world_size)
    dist.barrier()
    dist.all_gather_into_tensor(out, torch.ones(2))      # FSDP2's calls before 2.13
    dist.reduce_scatter_tensor(torch.empty(2), out)


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")  # the old names, on purpose
@pytest.mark.parametrize("torch_version, expected", [
    ((2, 12), ["all_gather_single", "reduce_scatter_single"]),
    ((2, 13), ["all_gather_into_tensor", "reduce_scatter_tensor"]),
])
def test_a_timeline_names_the_old_collectives_as_torch_2_13_does(
        monkeypatch, torch_version, expected):
    # a trace of FSDP2 on torch 2.9-2.12 reads as on 2.13 (notebook 06 looks
    # its all-gathers up by name): the recorder names each call traced_name's way
    monkeypatch.setattr(compat, "TORCH", torch_version)
    _, timeline = dt.sim.one_rank(gather_and_scatter, 2, dt.sim.Simulation("H100 SXM"))
    comm = timeline.after_last_barrier().filter(kind="comm")
    assert [e.name for e in comm.events] == expected


def test_a_simulation_registers_meta_collectives_first(monkeypatch):
    # torch 2.9-2.10 have c10d's meta kernels only once fake_collectives is
    # imported: a simulated step on meta tensors must ask for them itself
    asked = []
    monkeypatch.setattr(compat, "register_meta_collectives", lambda: asked.append(True))

    def broadcast_meta(rank, world_size):
        dist.broadcast(torch.empty(4, device="meta"), src=0)

    dt.sim.one_rank(broadcast_meta, 2, dt.sim.Simulation("H100 SXM"))
    assert asked


@pytest.mark.parametrize("torch_version, expected", [
    ((2, 9), ["all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"]),
    ((2, 13), ["all_gather_single", "reduce_scatter_single", "all_reduce"])])
def test_torch_calls_the_collectives_by_its_own_names(monkeypatch, torch_version, expected):
    monkeypatch.setattr(compat, "TORCH", torch_version)
    names = ["all_gather_single", "reduce_scatter_single", "all_reduce"]
    assert [compat.called_name(n) for n in names] == expected
