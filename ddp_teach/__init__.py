"""ddp_teach: learn distributed data-parallel training by running it.

`run(fn, world_size)` runs a notebook-defined function on real worker
processes; `%load_ext ddp_teach` adds the `%%ddp -n N` cell magic.
"""
from ddp_teach.errors import WorkerError, WorkerTimeout
from ddp_teach.launcher import RunResult, run, shutdown


def load_ipython_extension(ipython):
    """`%load_ext ddp_teach`: register the %%ddp cell magic."""
    from ddp_teach.magic import register
    register(ipython)


__all__ = ["run", "RunResult", "WorkerError", "WorkerTimeout", "shutdown"]
