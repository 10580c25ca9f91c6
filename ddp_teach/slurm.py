"""An sbatch script that runs a training script under torchrun on SLURM,
and a dry run of it for machines without SLURM.

The pattern (one torchrun per node, torchrun starts the workers):
`#SBATCH --nodes=N --ntasks-per-node=1` gives N machines and one task on
each; `srun torchrun ...` starts that task on every machine, each one the
same command; the torchruns find each other through a c10d rendezvous on
the first machine of the allocation (`scontrol show hostnames`), and give
their workers RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. So
the script needs nothing from SLURM, and runs unchanged under torchrun on
one machine.

The other pattern (`launcher="srun"`), common in older cluster docs: no
torchrun, `--ntasks-per-node` = workers per node, and `srun python
train.py` starts every worker itself. SLURM numbers the tasks in its own
variables, so the job script renames them to torch's before Python starts
(`torch_env` is the same mapping in Python): SLURM_PROCID -> RANK,
SLURM_LOCALID -> LOCAL_RANK, SLURM_NTASKS -> WORLD_SIZE,
SLURM_NTASKS_PER_NODE -> LOCAL_WORLD_SIZE, SLURM_NODEID -> GROUP_RANK, the
first host of SLURM_JOB_NODELIST -> MASTER_ADDR (SLURM sets
SLURM_NTASKS_PER_NODE only when --ntasks-per-node is given, as here). The
same script then runs under both. What it gives up: torchrun's restarts;
`srun --kill-on-bad-exit=1` at least ends every task when one fails
(without it, the default depends on the cluster's KillOnBadExit setting).

`dry_run` runs the sbatch script with bash, with stand-ins for `scontrol`
and `srun` on the PATH and the variables SLURM would set: it shows the
command each node would run, after the script's own variables are filled
in. `run_locally` then really runs those commands, every "node" on this
machine (a node list of `localhost`s), to prove the script works.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddp_teach.launcher.launch import kernel_store
from ddp_teach.launcher.torchrun import TorchrunResult, free_port, run_commands

TEMPLATE = """#!/bin/bash
# {nodes} nodes x {nproc} processes, {what}.
# Submit with: sbatch {name}
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
{resources}#SBATCH --time={time}
#SBATCH --output=%x-%j.out

set -euo pipefail

# {meeting}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=${{MASTER_PORT:-29500}}
{threads}# The network the processes talk over (`ip addr` on a node), e.g.:
# export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0

{launch}"""
LAUNCHERS = {  # launcher -> (what, tasks per node, meeting point, launch lines)
    "torchrun": ("one torchrun per node", "1",
                 "The first node of the allocation hosts torchrun's rendezvous store.",
                 """# One task per node; each runs torchrun, which starts {nproc} workers.
srun torchrun \\
    --nnodes="$SLURM_NNODES" \\
    --nproc-per-node={nproc} \\
    --rdzv-id="$SLURM_JOB_ID" \\
    --rdzv-backend=c10d \\
    --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \\
    {script}
"""),
    "srun": ("one srun task per process (no torchrun)", "{nproc}",
             "Every task meets the others at the first node of the allocation.",
             """# srun starts {nproc} tasks per node; each gives SLURM's numbers torch's
# names, then becomes the training script ("$@": arguments after the
# script's name, passed on). Nothing restarts a task that dies, and its
# peers would fail in their next collective or wait in it until the
# timeout: --kill-on-bad-exit=1 has SLURM end them all at once.
srun --kill-on-bad-exit=1 bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \\
    WORLD_SIZE=$SLURM_NTASKS LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE \\
    GROUP_RANK=$SLURM_NODEID
exec python {script} "$@"' bash
"""),
}
FAKE_SCONTROL = """#!/bin/sh
# stand-in for SLURM's scontrol: knows only `show hostnames`
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: $*" >&2; exit 1; }
printf '%s\\n' $DDP_TEACH_HOSTS
"""
FAKE_SRUN = """#!{python}
# stand-in for SLURM's srun: records the task it would start on each node
import json, os, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):  # srun's own --option=value
    args.pop(0)
hosts = os.environ["DDP_TEACH_HOSTS"].split()
per_node = int(os.environ["SLURM_NTASKS_PER_NODE"])
with open(os.environ["DDP_TEACH_SRUN_LOG"], "a") as log:
    for node, host in enumerate(hosts):
        for local in range(per_node):
            env = dict(os.environ, SLURM_NODEID=str(node), SLURMD_NODENAME=host,
                       SLURM_PROCID=str(node * per_node + local),
                       SLURM_LOCALID=str(local))
            log.write(json.dumps({{"host": host, "argv": args, "env": env}}) + "\\n")
"""
SHOWN = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "SLURM_NODEID",
         "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")


@dataclass
class Task:
    """What srun would start on one node: a command and its environment."""
    host: str
    argv: list
    env: dict

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    def __str__(self) -> str:
        shown = " ".join(f"{k}={self.env[k]}" for k in SHOWN if k in self.env)
        return f"{self.host}: {shown}\n    {self.command}"


def sbatch_script(script, *, nodes=2, nproc_per_node=4, gpus_per_node=None,
                  cpus_per_task=None, time="00:30:00", job_name="ddp",
                  name="job.sbatch", launcher="torchrun") -> str:
    """The text of an sbatch script running `script` (path and arguments,
    one string) on `nodes` nodes x `nproc_per_node` workers: one torchrun
    per node (`launcher="torchrun"`) or one srun task per worker
    (`launcher="srun"`); see the module's doc. cpus_per_task is per task:
    a torchrun's workers share it, an srun task has it to itself."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be 'torchrun' or 'srun'; got {launcher!r}")
    resources = ""
    if gpus_per_node:
        resources += f"#SBATCH --gpus-per-node={gpus_per_node}\n"
    if cpus_per_task:
        resources += f"#SBATCH --cpus-per-task={cpus_per_task}\n"
    share = f"$(( SLURM_CPUS_PER_TASK / {nproc_per_node} ))" \
        if launcher == "torchrun" else "$SLURM_CPUS_PER_TASK"
    threads = (f"export OMP_NUM_THREADS={share}  # each worker's share of "
               "the cores\n" if cpus_per_task else "")
    what, tasks, meeting, launch = LAUNCHERS[launcher]
    return TEMPLATE.format(
        what=what, tasks=tasks.format(nproc=nproc_per_node), meeting=meeting,
        launch=launch.format(nproc=nproc_per_node, script=script), nodes=nodes,
        nproc=nproc_per_node, name=name, job_name=job_name, resources=resources,
        time=time, threads=threads)


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact node list, spelt out: "gpu[01-02],cpu7" gives
    gpu01, gpu02, cpu7 (what `scontrol show hostnames` prints)."""
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,]+)",
                                            nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{len(first)}d}")
    return hosts


def torch_env(slurm_env: dict) -> dict:
    """What one srun task of the srun pattern must be told, in torch's
    names (`init_process_group`'s env:// and torchrun's scripts read
    these), from what SLURM set for it."""
    return {"RANK": slurm_env["SLURM_PROCID"],
            "LOCAL_RANK": slurm_env["SLURM_LOCALID"],
            "WORLD_SIZE": slurm_env["SLURM_NTASKS"],
            "LOCAL_WORLD_SIZE": slurm_env["SLURM_NTASKS_PER_NODE"],
            "GROUP_RANK": slurm_env["SLURM_NODEID"],
            "MASTER_ADDR": expand_nodelist(slurm_env["SLURM_JOB_NODELIST"])[0],
            "MASTER_PORT": slurm_env.get("MASTER_PORT", "29500")}


def dry_run(sbatch_path, *, nodelist="node[01-02]", job_id="4242",
            env=None, timeout=30.0) -> list[Task]:
    """Run the sbatch script with stand-in `scontrol` and `srun`: the
    tasks srun would start (`--ntasks-per-node` on each node of
    `nodelist`), in the order of SLURM_PROCID."""
    text = Path(sbatch_path).read_text()
    hosts = expand_nodelist(nodelist)
    nodes = int(_sbatch_option(text, "nodes", len(hosts)))
    if nodes != len(hosts):
        raise ValueError(f"the script asks for {nodes} nodes but the node "
                         f"list {nodelist!r} has {len(hosts)}")
    shims = tempfile.mkdtemp(prefix="fake-slurm-")
    try:
        for name, body in (("scontrol", FAKE_SCONTROL),
                           ("srun", FAKE_SRUN.format(python=sys.executable))):
            path = Path(shims, name)
            path.write_text(body)
            path.chmod(0o755)
        log = Path(shims, "srun.log")
        per_node = int(_sbatch_option(text, "ntasks-per-node", 1))
        slurm = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": nodelist,
                 "SLURM_NNODES": str(nodes), "SLURM_NTASKS_PER_NODE": str(per_node),
                 "SLURM_NTASKS": str(nodes * per_node),
                 "SLURM_JOB_NAME": _sbatch_option(text, "job-name", "job"),
                 "DDP_TEACH_HOSTS": " ".join(hosts),
                 "DDP_TEACH_SRUN_LOG": str(log)}
        cpus = _sbatch_option(text, "cpus-per-task", None)
        if cpus:
            slurm["SLURM_CPUS_PER_TASK"] = cpus
        run_env = {**os.environ, **(env or {}), **slurm,
                   "PATH": shims + os.pathsep + os.environ["PATH"]}
        done = subprocess.run(["bash", str(sbatch_path)], env=run_env,
                              cwd=Path(sbatch_path).parent, timeout=timeout,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the sbatch script failed (exit status "
                               f"{done.returncode}):\n{done.stderr}")
        records = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        shutil.rmtree(shims, ignore_errors=True)
    ours = ("PATH", "DDP_TEACH_HOSTS", "DDP_TEACH_SRUN_LOG")
    return [Task(r["host"], r["argv"], {  # what the job script changed
        k: v for k, v in r["env"].items()
        if os.environ.get(k) != v and k not in ours}) for r in records]


def run_locally(sbatch_path, *, timeout=60.0, echo=True,
                results=True) -> TorchrunResult:
    """Run the script's srun tasks for real, every "node" on this machine:
    a torchrun per node (its stores on 127.0.0.1), or, for the srun
    pattern, a worker per task. Those workers' `init_process_group` would
    make rank 0 host the store on every network interface; here this
    process hosts it on 127.0.0.1 and every rank connects to it
    (TORCHELASTIC_USE_AGENT_STORE, as under torchrun's agent)."""
    nodes = int(_sbatch_option(Path(sbatch_path).read_text(), "nodes", 1))
    tasks = dry_run(sbatch_path, nodelist=",".join(["localhost"] * nodes),
                    env={"MASTER_PORT": str(free_port())})
    if tasks[0].argv[0] == "torchrun":
        world = nodes * int(_torchrun_option(tasks[0].argv, "nproc-per-node", 1))
        return run_commands([t.argv for t in tasks],
                            node_envs=[t.env for t in tasks],
                            cwd=Path(sbatch_path).parent, timeout=timeout,
                            echo=echo, results=results, world_size=world)
    store, port = kernel_store(timeout)
    tasks = dry_run(sbatch_path, nodelist=",".join(["127.0.0.1"] * nodes),
                    env={"MASTER_PORT": str(port)})
    # `python` in the job script: this interpreter, as an activated
    # environment on a cluster node would make it
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    try:
        return run_commands([t.argv for t in tasks],
                            env={"PATH": path, "TORCHELASTIC_USE_AGENT_STORE": "True"},
                            node_envs=[t.env for t in tasks],
                            labels=[f"task {i}" for i in range(len(tasks))],
                            cwd=Path(sbatch_path).parent, timeout=timeout,
                            echo=echo, results=results, world_size=len(tasks))
    finally:
        del store  # the server stops with its last reference


def _sbatch_option(text, name, default):
    found = re.search(rf"^#SBATCH\s+--{name}[= ](\S+)", text, re.MULTILINE)
    return found.group(1) if found else default


def _torchrun_option(argv, name, default):
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return default
