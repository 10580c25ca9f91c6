"""Notebook 07's planted mistakes for the checkpoint exercise (PLANTED, run
by test_registry.py, which also checks every reference and stub): each
must get the hint that fits. The last three are the second attempt's
mistakes: the barrier inside `if rank == 0:`, the objects saved instead of
their state_dicts, and the next epoch saved instead of the one given."""
import os

import torch
import torch.distributed as dist


def state(model, optimizer, epoch):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "epoch": epoch}


def every_rank_writes(model, optimizer, epoch, path):
    torch.save(state(model, optimizer, epoch), f"{path}.{dist.get_rank()}")
    os.replace(f"{path}.{dist.get_rank()}", path)
    dist.barrier()


def no_barrier(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)


def straight_into_place(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), path)
    dist.barrier()


def model_only(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "epoch": epoch},
                   f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


# ---- the second attempt ---------------------------------------------------------

def barrier_on_rank_0_only(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
        dist.barrier()  # indented one level too far: rank 1 never comes


def saves_the_objects(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save({"model": model, "optimizer": optimizer, "epoch": epoch},
                   f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


def saves_the_next_epoch(model, optimizer, epoch, path):
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch + 1), f"{path}.tmp")  # "resume here"
        os.replace(f"{path}.tmp", path)
    dist.barrier()


# ---- tried as a learner would (issue 34) ------------------------------------------

def writer_by_local_rank(model, optimizer, epoch, path):
    """Right on one node only: LOCAL_RANK is 0 once per node."""
    if int(os.environ["LOCAL_RANK"]) == 0:
        torch.save(state(model, optimizer, epoch), f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


def temporary_file_copied_onto_the_path(model, optimizer, epoch, path):
    """A temporary file, then copied (byte by byte) onto the path."""
    import shutil
    if dist.get_rank() == 0:
        torch.save(state(model, optimizer, epoch), f"{path}.tmp")
        shutil.copyfile(f"{path}.tmp", path)
        os.remove(f"{path}.tmp")
    dist.barrier()


def through_an_open_file(model, optimizer, epoch, path):
    """torch.save into the checkpoint's file, opened by hand."""
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            torch.save(state(model, optimizer, epoch), f)
    dist.barrier()


def named_temporary_file_then_rename(model, optimizer, epoch, path):
    """Right, in another style: tempfile in the same folder, pathlib rename."""
    import pathlib
    import tempfile
    if dist.get_rank() == 0:
        target = pathlib.Path(path)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as f:
            torch.save(state(model, optimizer, epoch), f)
        pathlib.Path(f.name).rename(target)
    dist.barrier()


def bytes_in_memory_then_replace(model, optimizer, epoch, path):
    """Right, in another style: serialised in memory, written, renamed."""
    import io
    if dist.get_rank() == 0:
        buffer = io.BytesIO()
        torch.save(state(model, optimizer, epoch), buffer)
        with open(path + ".partial", "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".partial", path)
    dist.barrier()


def test_atomic_saves_in_other_styles_pass(verdict):
    for right in (named_temporary_file_then_rename, bytes_in_memory_then_replace):
        passed, seen = verdict("checkpoint_save", right)
        assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("checkpoint_save", every_rank_writes, "only rank 0 writes"),
    ("checkpoint_save", no_barrier, "dist.barrier() after rank 0's save"),
    ("checkpoint_save", straight_into_place, "os.replace(tmp, path)"),
    ("checkpoint_save", model_only, "the optimizer's momentum is state too"),
    ("checkpoint_save", barrier_on_rank_0_only, "which rank 1 never called"),
    ("checkpoint_save", saves_the_objects, ("weights_only=True", "not the objects")),
    ("checkpoint_save", saves_the_next_epoch, "save the epoch you were given"),
    ("checkpoint_save", writer_by_local_rank, ("LOCAL_RANK is 0 on both",
                                               "only rank 0 writes (the global rank")),
    ("checkpoint_save", temporary_file_copied_onto_the_path,
     ("rewritten in place", "os.replace(tmp, path)")),
    ("checkpoint_save", through_an_open_file, ("while rank 0's torch.save wrote",
                                               "os.replace(tmp, path)")),
]
