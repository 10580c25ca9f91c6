"""A notebook function becomes a script that torchrun runs unchanged: on one
node, on two "nodes", through a SLURM job file, and after a worker is
killed, always with dt.run's parameters; nothing is left running and
nothing listens beyond 127.0.0.1."""
import linecache
import os
import re
import subprocess
import sys
import time

import psutil
import pytest
import torch

import ddp_teach as dt
from ddp_teach import scripts, slurm

NOTEBOOK = '''
import os
import signal
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_teach.checkpoint import load_checkpoint, save_checkpoint

STEPS, HIDDEN = 3, [8]


class Batches:
    def __init__(self, rank, epoch=0):
        self.g = torch.Generator().manual_seed(100 * epoch + rank)

    def next(self):
        return torch.randn(8, 4, generator=self.g)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, HIDDEN[0]), nn.Tanh(),
                         nn.Linear(HIDDEN[0], 1))


def listening():
    """Addresses this worker and its launcher listen on."""
    import psutil
    me = psutil.Process()
    return sorted({c.laddr.ip for p in (me, me.parent())
                   for c in p.net_connections() if c.status == "LISTEN"})


def train(rank, world_size, steps=STEPS):
    print(f"RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']}")
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = Batches(rank)
    for _ in range(steps):
        opt.zero_grad()
        model(batches.next()).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], listening()


def elastic_train(rank, world_size, path, crash_in_epoch=None, epochs=4):
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = load_checkpoint(model, opt, path)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"attempt {attempt}: starting at epoch {start}", flush=True)
    for epoch in range(start, epochs):
        batches = Batches(rank, epoch)
        for step in range(3):
            opt.zero_grad()
            model(batches.next()).square().mean().backward()
            opt.step()
            if (epoch, step, rank, attempt) == (crash_in_epoch, 1, 1, 0):
                print(f"rank 1: killed in epoch {epoch}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        save_checkpoint(model, opt, epoch, path)
    return [p.detach().clone() for p in model.parameters()]
'''


def run_cell(source, namespace):
    """Run `source` as a notebook kernel runs a cell: globals of __main__,
    the source kept in linecache only."""
    filename = f"<notebook-cell-{len(linecache.cache)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True),
                                 filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def notebook():
    return run_cell(NOTEBOOK, {"__name__": "__main__"})


def equal_params(runs, reference):
    return len(runs) == len(reference) and all(
        torch.equal(a, b) for run, ref in zip(runs, reference)
        for a, b in zip(run, ref))


def test_export_writes_what_the_function_uses(notebook, tmp_path):
    text = scripts.export(notebook["train"], tmp_path / "t.py").read_text()
    for needed in ("import torch.nn as nn", "class Batches:",
                   "def make_model():", "def listening():", "STEPS = 3",
                   "HIDDEN = [8]", "from torch.nn.parallel.distributed import "
                   "DistributedDataParallel as DDP", 'if __name__ == "__main__":'):
        assert needed in text, f"the script lacks {needed!r}"
    assert "def elastic_train" not in text, "only what train uses"
    assert text.index("def make_model") < text.index("def train"), \
        "helpers come before the function that uses them"
    compile(text, "t.py", "exec")


def test_export_refuses_what_a_script_cannot_carry(notebook, tmp_path):
    def closure(rank, world_size):
        return tmp_path

    namespace = run_cell("def uses_tensor(rank, world_size):\n"
                         "    return weights\n",
                         dict(notebook, weights=torch.ones(2)))
    with pytest.raises(TypeError, match="lambda"):
        scripts.export(lambda rank, world_size: rank, tmp_path / "a.py")
    with pytest.raises(TypeError, match="tmp_path"):
        scripts.export(closure, tmp_path / "b.py")
    with pytest.raises(TypeError, match="'weights' \\(a Tensor\\)"):
        scripts.export(namespace["uses_tensor"], tmp_path / "c.py")
    with pytest.raises(TypeError, match="plain values"):
        scripts.export(notebook["train"], tmp_path / "d.py",
                       args=(torch.ones(1),))


def test_one_node_and_two_nodes_agree_with_dt_run(notebook, tmp_path):
    script = scripts.export(notebook["train"], tmp_path / "train.py",
                            backend="gloo")
    in_notebook = dt.run(notebook["train"], 2, backend="gloo")
    one = scripts.torchrun(script, nproc_per_node=2, echo=False)
    two = scripts.torchrun(script, nnodes=2, nproc_per_node=1, echo=False,
                           max_restarts=1)  # gloo may abort while connecting
    for job in (one, two):
        assert job.ok, job.output
        assert equal_params([v[0] for v in job.values],
                            [v[0] for v in in_notebook]), "same parameters"
        for _, addresses in job.values:  # workers and torchrun agents
            assert addresses and set(addresses) == {"127.0.0.1"}, addresses
    assert "[node 1] [default0]:RANK=1 LOCAL_RANK=0" in two.output, \
        "on two nodes of one process, LOCAL_RANK is 0 on both"
    assert len(two.commands) == 2 and two.commands[0] == two.commands[1]


# A thread that has been told to stop can take a moment to leave
# /proc/self/task on a busy machine, so without DDP the count is read until
# it settles at the starting one or SETTLE_S has passed (threads still there
# then are kept alive, not slow). With DDP it is read at once: what aborts
# is a thread still there when Python goes on to shut down.
SETTLE_S = 5
LEFT_THREADS = f"""
import os, sys, time
import torch.distributed as dist, torch.nn as nn
count = lambda: len(os.listdir("/proc/self/task"))
before = count()
dist.init_process_group("gloo")  # env://, one process
if sys.argv[1] == "ddp":
    nn.parallel.DistributedDataParallel(nn.Linear(2, 2), init_sync=False)
dist.destroy_process_group()
deadline = time.monotonic() + {SETTLE_S}
while sys.argv[1] == "nothing" and count() > before and time.monotonic() < deadline:
    time.sleep(0.05)
print(count() - before)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                    reason="counts threads in /proc/self/task (Linux only)")
@pytest.mark.parametrize("build", ["nothing", "ddp"])
def test_why_scripts_skip_python_shutdown(build, tmp_path):
    """Exported scripts end with os._exit because, in the pinned torch,
    building a DDP model (which imports torch._dynamo) keeps the gloo
    group's threads alive after destroy_process_group: one of them can
    still be freeing backward's last collective while Python shuts down,
    and the process aborts. When this test fails for "ddp", torch has
    fixed it, and the entry point can return normally again."""
    script = tmp_path / "left.py"
    script.write_text(LEFT_THREADS)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
               MASTER_PORT=str(scripts.free_port()))
    done = subprocess.run([sys.executable, str(script), build], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    left = int(done.stdout.split()[-1])
    if build == "nothing":
        assert left == 0, (f"{left} thread(s) outlived destroy_process_group "
                           f"by {SETTLE_S} s without DDP")
    else:
        assert left > 0, ("gloo's threads now end with the group: the "
                          "os._exit in scripts.ENTRY_POINT may go")


def test_killed_worker_restarts_and_resumes_from_checkpoint(notebook,
                                                            tmp_path):
    uninterrupted = dt.run(notebook["elastic_train"], 2, backend="gloo",
                           args=(str(tmp_path / "calm.pt"),))
    script = scripts.export(notebook["elastic_train"], tmp_path / "el.py",
                            args=(str(tmp_path / "crash.pt"), 2),
                            backend="gloo")
    job = scripts.torchrun(script, nproc_per_node=2, max_restarts=1,
                           echo=False)
    assert job.ok, job.output
    # the killed rank's last words: torchrun's own line names whichever
    # failure its agent saw first, rank 1's SIGKILL (exitcode -9) or rank
    # 0's lost connection (exitcode 1), depending on timing
    assert "rank 1: killed in epoch 2" in job.output, "rank 1 was SIGKILLed"
    assert re.search(r"failed \(exitcode: (-9|1)\)", job.output), job.output
    assert "attempt 1: starting at epoch 2" in job.output, \
        "the restart resumed from the checkpoint of epoch 1"
    assert equal_params(job.values, uninterrupted), \
        "same parameters as the run that never crashed"


def test_timeout_kills_the_whole_tree_even_new_sessions(tmp_path):
    """torchrun's workers run in sessions of their own; a timeout must
    still end them (here: a child in a new session, without torch)."""
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('started', flush=True)\ntime.sleep(60)\n")
    started = time.monotonic()
    job = scripts.run_commands([[sys.executable, "-c", code]], timeout=2,
                               echo=False)
    assert job.timed_out and not job.ok and "timed out" in job.output
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            break  # dead; its new parent reaps it
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or \
        psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_sbatch_script_dry_run_shows_each_nodes_command(tmp_path):
    job = tmp_path / "job.sbatch"
    job.write_text(slurm.sbatch_script("train.py --epochs 3", nodes=2,
                                       nproc_per_node=4, gpus_per_node=4,
                                       cpus_per_task=32))
    text = job.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=4", 'scontrol show hostnames '
                 '"$SLURM_JOB_NODELIST" | head -n 1', "srun torchrun"):
        assert line in text
    subprocess.run(["bash", "-n", str(job)], check=True)  # valid bash
    tasks = slurm.dry_run(job, nodelist="gpu[07-08]")
    assert [t.host for t in tasks] == ["gpu07", "gpu08"]
    assert [t.env["SLURM_NODEID"] for t in tasks] == ["0", "1"]
    assert all(t.env["MASTER_ADDR"] == "gpu07" and
               t.env["OMP_NUM_THREADS"] == "8" for t in tasks)
    assert tasks[0].argv == tasks[1].argv == [
        "torchrun", "--nnodes=2", "--nproc-per-node=4", "--rdzv-id=4242",
        "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29500", "train.py",
        "--epochs", "3"]
    with pytest.raises(ValueError, match="3"):
        slurm.dry_run(job, nodelist="a[1-3]")


def test_expand_nodelist_spells_out_slurm_ranges():
    assert slurm.expand_nodelist("gpu[07-09,12],cpu3,n[1-2]") == [
        "gpu07", "gpu08", "gpu09", "gpu12", "cpu3", "n1", "n2"]


def test_sbatch_commands_really_run_on_two_local_nodes(notebook, tmp_path):
    scripts.export(notebook["train"], tmp_path / "train.py", backend="gloo")
    job = tmp_path / "cpu.sbatch"
    job.write_text(slurm.sbatch_script("train.py", nodes=2, nproc_per_node=1))
    result = slurm.run_locally(job, echo=False)
    assert result.ok, result.output
    in_notebook = dt.run(notebook["train"], 2, backend="gloo")
    assert equal_params([v[0] for v in result.values],
                        [v[0] for v in in_notebook])


def test_srun_pattern_gives_slurms_numbers_torchs_names_and_runs_a_task_per_worker(
        notebook, tmp_path):
    scripts.export(notebook["train"], tmp_path / "train.py", backend="gloo")
    job = tmp_path / "srun.sbatch"
    job.write_text(slurm.sbatch_script("train.py", nodes=2, nproc_per_node=2,
                                       launcher="srun"))
    text = job.read_text()
    assert "#SBATCH --ntasks-per-node=2" in text and "srun torchrun" not in text
    assert "srun --kill-on-bad-exit=1 bash -c" in text  # one fails, all end
    subprocess.run(["bash", "-n", str(job)], check=True)  # valid bash
    tasks = slurm.dry_run(job, nodelist="gpu[07-08]")
    assert [(t.host, t.env["SLURM_PROCID"], t.env["SLURM_LOCALID"]) for t in tasks] \
        == [("gpu07", "0", "0"), ("gpu07", "1", "1"), ("gpu08", "2", "0"),
            ("gpu08", "3", "1")]
    assert slurm.torch_env(tasks[3].env) == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}
    result = slurm.run_locally(job, echo=False)  # the job script's mapping, run
    assert result.ok, result.output
    assert "[task 3] RANK=3 LOCAL_RANK=1" in result.output
    in_notebook = dt.run(notebook["train"], 4, backend="gloo")
    assert equal_params([v[0] for v in result.values], [v[0] for v in in_notebook])
    for _, addresses in result.values:  # no worker hosts a store of its own
        assert addresses and set(addresses) == {"127.0.0.1"}, addresses
    with pytest.raises(ValueError, match="launcher must be"):
        slurm.sbatch_script("train.py", launcher="mpirun")
