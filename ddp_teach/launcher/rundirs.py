"""Where each run keeps its logs and stacks: a private folder per kernel.

Every run gets a fresh folder (made by `mkdtemp`, so only its owner can read
it) under the system's temporary directory, in a folder per user and per
kernel. Each kernel prunes only its own old runs, so two notebooks never
delete each other's live runs.
"""
import os
import shutil
import tempfile
from datetime import datetime

KEEP_RUN_DIRS = 20


def new_run_dir() -> str:
    """A fresh folder for this run's logs and stacks.

    Each kernel has a folder of its own and prunes only its own old runs, so
    two notebooks never delete each other's live runs; folders of kernels that
    have exited are removed.
    """
    base = os.path.join(tempfile.gettempdir(), f"ddp_teach-{os.getuid()}")
    mine = os.path.join(base, f"kernel-{os.getpid()}")
    os.makedirs(mine, exist_ok=True)
    for name in os.listdir(base):
        pid = name.removeprefix("kernel-")
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    old = sorted(os.listdir(mine))
    for name in old[:max(0, len(old) - KEEP_RUN_DIRS + 1)]:
        shutil.rmtree(os.path.join(mine, name), ignore_errors=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")  # sorts by age
    return tempfile.mkdtemp(prefix=f"run-{stamp}-", dir=mine)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process holds that pid
