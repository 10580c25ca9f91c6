"""Checker for notebook 07's torchrun exercise (the checkpoint exercise is
checked in nb07_checkpoint.py).

`torchrun_script`: the learner's `my_main()` is the body of a script. It
is checked where it must work: exported with `dt.scripts` and run by real
torchrun processes, three "nodes" of one process each on this machine.
That layout is chosen on purpose: LOCAL_RANK is 0 on every process and
LOCAL_WORLD_SIZE is 1, so code that takes LOCAL_RANK (or a hard-coded 0)
for the global rank fails here, where on one node it would pass, and so
does a world size written into the code as 2. A harness around `my_main`
(running in each worker) records what it did: the arguments it gave
`init_process_group`, the rank and size it gave `train`, whether it
destroyed the group. It also keeps a wrong call from hanging the job: the
group is always created from torchrun's values.

What the reference, `ddp_teach.scripts.torchrun_main`, guarantees, and how
each property is checked on every process's record:

- the group comes from torchrun's environment (`init_process_group` with
  no init_method or store: env://), before `train` runs;
- rank and world size are RANK and WORLD_SIZE, as ints: on three nodes of
  one process, neither LOCAL_RANK nor LOCAL_WORLD_SIZE nor a constant
  gives them;
- the group is destroyed after `train`, before returning;
- the result is `train`'s, equal to `dt.run`'s on as many ranks.

Each torchrun worker is a Python process of its own, with its own hash
seed; nothing here depends on one.
"""
import ast
import functools
import inspect
import os
import shutil
import sys
import tempfile
import textwrap
from datetime import timedelta

import torch
import torch.distributed as dist

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)
from ddp_teach.scripts import train

PG_TIMEOUT_S = 20
RUN_TIMEOUT_S = 60.0
NODES = 3  # of one process each: LOCAL_RANK 0 everywhere, WORLD_SIZE 3
RANK_HINT = ("the global rank is RANK. LOCAL_RANK counts the processes on one "
             "machine (here each node runs one, so it is 0 on every node) and "
             "picks the GPU; a number written in the code is right on one "
             "process only. rank = int(os.environ['RANK']).")
WORLD_HINT = ("the world size is WORLD_SIZE, every process on every node; "
              "LOCAL_WORLD_SIZE counts one node's (1 here), and a number "
              "written in the code is right for one job size only.")
ERROR_HINTS = {  # a piece of the error's text: what it means
    "before init_process_group": (
        "create the process group with dist.init_process_group(\"gloo\") "
        "first: torchrun starts the processes but does not connect them."),
    "after destroy_process_group": (
        "the group was destroyed before train ran: destroy it at the end, "
        "once train has returned."),
    "has not been initialized": (
        "dist.get_rank() and dist.get_world_size() work only once the group "
        "exists; before init_process_group, read RANK and WORLD_SIZE from "
        "os.environ."),
}


def harness(main, out_dir) -> None:
    """In a torchrun worker: run `main()`, save what it did to out_dir.
    (Checking plumbing: it swaps the script's own `train` and
    `init_process_group` for recording ones; `ddp_teach.scripts.train`, used
    here, stays the real job.)"""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    record = {"env": {n: os.environ[n] for n in names}, "init": None,
              "train": [], "error": None, "result": None}
    real_init = dist.init_process_group

    def init_process_group(backend=None, init_method=None, timeout=None,
                           world_size=-1, rank=-1, store=None, **kwargs):
        record["init"] = {"init_method": init_method, "rank": rank,
                          "world_size": world_size, "store": store is not None}
        real_init("gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))

    def recorded_train(rank, world_size, *args, **kwargs):
        record["train"].append((rank, world_size))
        if not dist.is_initialized():
            raise RuntimeError("train() was called after destroy_process_group()"
                               if record["init"] else
                               "train() was called before init_process_group()")
        return train(rank, world_size)

    dist.init_process_group = init_process_group
    for name, value in list(main.__globals__.items()):
        if value is real_init:
            main.__globals__[name] = init_process_group
    main.__globals__["train"] = recorded_train
    try:
        record["result"] = main()
    except NotImplementedError:
        record["error"] = NOT_ATTEMPTED
    except Exception as exc:  # reported to the learner, not raised
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["left_initialized"] = dist.is_initialized()
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.save(record, os.path.join(out_dir, f"rank{record['env']['RANK']}.pt"))
    # without Python's shutdown, as exported scripts end (see the comment
    # at the end of their entry point, ddp_teach.scripts.ENTRY_POINT)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _is_stub(fn) -> bool:
    """True when the body (after its docstring) starts by raising
    NotImplementedError: no need to start torchrun to know."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        return False
    if body and isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    raised = body[0].exc if body and isinstance(body[0], ast.Raise) else None
    target = raised.func if isinstance(raised, ast.Call) else raised
    return getattr(target, "id", None) == "NotImplementedError"


def check_torchrun_script(fn) -> Verdict:
    from ddp_teach import scripts
    if _is_stub(fn):
        return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    work = tempfile.mkdtemp(prefix="torchrun-check-")
    try:
        path = os.path.join(work, "main_check.py")
        try:
            text = scripts.source(fn)
        except (TypeError, OSError) as exc:
            return Verdict(WRONG, f"{fn.__name__} cannot become a script: {exc}")
        with open(path, "w") as f:
            f.write(text + "\n\nif __name__ == '__main__':\n    import sys\n"
                    "    from ddp_teach.exercises.nb07_launching_at_scale import harness\n"
                    f"    harness({fn.__name__}, sys.argv[-1])\n")
        pythonpath = os.pathsep.join(  # so that the learner's modules import
            os.path.abspath(p or ".") for p in sys.path if os.path.isdir(p or "."))
        # max_restarts=1: the harness catches the learner's exceptions, so
        # only a crash restarts, such as gloo aborting while the workers
        # connect on a loaded machine (seen in CI, cf. pytorch#188266)
        job = scripts.torchrun(path, nnodes=NODES, nproc_per_node=1, echo=False,
                               max_restarts=1, timeout=RUN_TIMEOUT_S,
                               env={"PYTHONPATH": pythonpath})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    workers = [l for l in job.output.splitlines() if "[default" in l]
    tail = "\n".join((workers or job.output.splitlines())[-12:])
    if job.timed_out or None in job.values or len(job.values) != NODES:
        why = "did not finish" if job.timed_out else "ended without a result"
        return Verdict(WRONG, f"under torchrun ({NODES} nodes x 1 process) the "
                              f"job {why}. Its last lines:\n{tail}")
    return judge(job.values, _expected_params())


@functools.cache
def _expected_params() -> list:
    """What `dt.run` gives each of NODES ranks for `train`: computed once
    per kernel (train is deterministic, seeded by rank), so a second check
    costs only the torchrun job."""
    from ddp_teach.launcher import run
    return run(train, NODES, backend="gloo", timeout=30)


def judge(records, expected) -> Verdict:
    """The first mistake found, looking at every process for each kind in
    turn (a wrong rank on one process also spoils the others' results)."""
    if any(r["error"] == NOT_ATTEMPTED for r in records):
        return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    for check in (_strings, _raised, _skipped, _not_env, _wrong_rank,
                  _not_destroyed, _wrong_result):
        for r in records:
            where = (f"on the process with RANK={r['env']['RANK']}, "
                     f"LOCAL_RANK={r['env']['LOCAL_RANK']}, ")
            problem = check(r, expected[int(r["env"]["RANK"])])
            if problem:
                return Verdict(WRONG, where + problem)
    return Verdict(CORRECT, f"ran under torchrun as {len(records)} nodes x 1 "
                   "process (LOCAL_RANK 0 on every one): the group came from "
                   "torchrun's environment, each process trained as its own "
                   "rank, left the group cleanly, and the parameters equal "
                   "dt.run's.")


def _strings(r, _):
    given = [*([r["init"]["rank"], r["init"]["world_size"]] if r["init"] else []),
             *(value for call in r["train"] for value in call)]
    strings = [value for value in given if isinstance(value, str)]
    if strings:
        return (f"my_main passed the text {strings[0]!r} where a number "
                "belongs.\nHint: os.environ holds strings; convert them, "
                "rank = int(os.environ['RANK']).")


def _raised(r, _):
    if not r["error"]:
        return None
    hint = next((hint for text, hint in ERROR_HINTS.items() if text in r["error"]),
                "read the error above.")
    return f"my_main raised {r['error']}\nHint: {hint}"


def _skipped(r, _):
    if r["init"] is None or not r["train"]:
        missing = "init_process_group" if r["init"] is None else "train"
        return f"my_main never called {missing}."


def _not_env(r, _):
    if r["init"]["init_method"] not in (None, "env://") or r["init"]["store"]:
        return (f"init_process_group was given init_method="
                f"{r['init']['init_method']!r} (or a store).\nHint: torchrun "
                "puts the meeting point in MASTER_ADDR and MASTER_PORT; leave "
                "init_method out and init_process_group reads them (env://).")


def _wrong_rank(r, _):
    rank, size = int(r["env"]["RANK"]), int(r["env"]["WORLD_SIZE"])
    init = r["init"]
    for given_rank, given_size in [(init["rank"], init["world_size"])] + [
            tuple(call) for call in r["train"]]:
        if given_rank not in (-1, rank):
            return f"my_main used rank {given_rank}.\nHint: {RANK_HINT}"
        if given_size not in (-1, size):
            return f"my_main used world size {given_size}.\nHint: {WORLD_HINT}"


def _not_destroyed(r, _):
    if r["left_initialized"]:
        return ("the process group was still there when my_main returned.\n"
                "Hint: end with dist.destroy_process_group(), so that the "
                "process leaves the group cleanly.")


def _wrong_result(r, expected):
    got = r["result"]
    if not (isinstance(got, (list, tuple)) and len(got) == len(expected)
            and all(isinstance(a, torch.Tensor) and torch.equal(a, b)
                    for a, b in zip(got, expected))):
        return (f"my_main returned {type(got).__name__} {str(got)[:50]}..., "
                "not train's parameters.\nHint: return what train(rank, "
                "world_size) returned.")


register(Exercise(
    "torchrun_script", "A script that torchrun runs", "my_main",
    "ddp_teach.scripts:torchrun_main", check_torchrun_script,
    ["torchrun starts the processes and tells each who it is in its "
     "environment: RANK, WORLD_SIZE (and LOCAL_RANK, for the GPU).",
     "dist.init_process_group(\"gloo\") with no address or rank reads "
     "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE itself.",
     "rank = int(os.environ['RANK']); world_size = int(os.environ["
     "'WORLD_SIZE']); init; params = train(rank, world_size); "
     "dist.destroy_process_group(); return params."]))
