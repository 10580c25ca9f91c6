"""Where each run keeps its logs and stacks: a private folder per kernel.

Every run gets a fresh folder (made by `mkdtemp`, so only its owner can read
it) under the system's temporary directory, in a folder per user and per
kernel. Each kernel prunes only its own old runs, so two notebooks never
delete each other's live runs. A kernel's folder stays while the kernel
lives, for the learner to read, and is removed when it exits (atexit); the
folder of one that was killed is removed by the next run of any kernel.

The per-user folder has a name anyone can predict, in a directory everyone
can write (/tmp). Another local user could make it first, open to all, and
plant links named `rank0.log` pointing at the learner's files; so the
folders are made 0700, and one that exists is used only when it is a real
folder (not a link), the learner's own, and writable by no one else. Log and
stack files are created new (never opened through a link) and 0600.
The per-user runtime directory (XDG_RUNTIME_DIR) is not used: it is a small
RAM disk on most systems, and twenty runs of a chatty job fill it.
"""
import atexit
import os
import shutil
import stat
import tempfile
from datetime import datetime

KEEP_RUN_DIRS = 20
_removed_at_exit: set[str] = set()  # kernel folders this process made


def new_run_dir() -> str:
    """A fresh folder for this run's logs and stacks.

    Each kernel has a folder of its own and prunes only its own old runs, so
    two notebooks never delete each other's live runs; folders of kernels that
    have exited are removed.
    """
    base = _private_folder(
        os.path.join(tempfile.gettempdir(), f"ddp_teach-{os.getuid()}"))
    mine = _private_folder(os.path.join(base, f"kernel-{os.getpid()}"))
    if mine not in _removed_at_exit:
        _removed_at_exit.add(mine)
        atexit.register(_remove_at_exit, mine, os.getpid())
    for name in os.listdir(base):
        pid = name.removeprefix("kernel-")
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    old = sorted(os.listdir(mine))
    for name in old[:max(0, len(old) - KEEP_RUN_DIRS + 1)]:
        shutil.rmtree(os.path.join(mine, name), ignore_errors=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")  # sorts by age
    return tempfile.mkdtemp(prefix=f"run-{stamp}-", dir=mine)


def _remove_at_exit(folder: str, owner_pid: int) -> None:
    """Remove a kernel's folder as the kernel exits; a forked child of the
    kernel inherits this handler and must leave the folder alone."""
    if os.getpid() == owner_pid:
        shutil.rmtree(folder, ignore_errors=True)


def create_private_file(path: str) -> int:
    """Create `path` as a new file only the user can read; its descriptor,
    open for writing. An existing file or link there is an error, never
    written through."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                   0o600)


def _private_folder(path: str) -> str:
    """Make `path` a folder only this user can use, or refuse the one that is
    there when someone else could have made it or can write in it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # checked below like any other
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder (a symbolic link, say)"
    elif info.st_uid != os.getuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = "can be written by other users"
    else:
        if stat.S_IMODE(info.st_mode) != 0o700:  # 0755 from an older version
            os.chmod(path, 0o700)
        return path
    raise PermissionError(
        f"ddp_teach keeps each run's logs in {path}, but that {problem}, so "
        "another user could read or redirect your runs' output. If it is "
        f"yours, remove it (rm -r {path}); or set TMPDIR to a folder of your "
        "own (e.g. TMPDIR=$HOME/tmp) before starting Jupyter. Then run again.")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process holds that pid
