"""The launcher: `dt.run` and `%%ddp` on real worker processes.

A first-time reader can skip this folder: it is what makes distributed code
runnable from a notebook, not what the course teaches. The pieces, in the
order a run uses them:

- `launch`: `run()` checks its input, starts the rendezvous store and asks
  the fork server for workers; `RunResult` is what comes back.
- `pickling`: the learner's function, shipped by value (cloudpickle).
- `forkserver`: one process that imported torch once and forks workers;
  `kernel_server`: the kernel's one server, used by one run at a time.
- `protocol` and `wire`: the typed messages kernel, server and workers send,
  and their framing on pipes and sockets.
- `worker`: what a forked process does to become rank r.
- `monitor` and `output`: the kernel's watch over a run, and every rank's
  output live in the cell; `progress_bars`: `dt.progress`, a bar per rank.
- `errors`: the failure and hang reports; `procs`: nothing outlives a run;
  `rundirs`: where each run's logs and stacks go.
- `magic`: the `%%ddp` cell magic; `torchrun` and `torchrun_loopback`: the
  same programs under torch's own launcher.
"""
from ddp_teach.launcher.errors import WorkerError, WorkerTimeout
from ddp_teach.launcher.kernel_server import current_fork_server, shutdown
from ddp_teach.launcher.launch import RunResult, run
from ddp_teach.launcher.progress_bars import progress

__all__ = ["RunResult", "WorkerError", "WorkerTimeout", "current_fork_server",
           "progress", "run", "shutdown"]
