"""Checkpoints for a job that may be restarted: rank 0 writes, all read.

When torchrun restarts a job (`--max-restarts`), every worker starts the
script again from its first line: what the job had learnt survives only
on disk. Hence the pattern, as in torch's elastic examples:

- only rank 0 writes. DDP keeps every rank's copy equal, so one file is
  enough, and N processes writing one file would corrupt it;
- it writes to a temporary name and then renames it: `os.replace` is
  atomic, so a worker killed in the middle of a write leaves the previous
  checkpoint whole, never half a file;
- a barrier after the write: no rank goes on (or dies, and has the job
  restarted) before the checkpoint is complete on disk;
- at the start every rank loads the checkpoint itself, if there is one,
  onto the CPU (`map_location`), and carries on from the epoch after it.
"""
import os

import torch
import torch.distributed as dist


def save_checkpoint(model, optimizer, epoch, path) -> None:
    """Rank 0 saves model, optimizer and epoch to `path`; all ranks wait."""
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(state, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


def load_checkpoint(model, optimizer, path) -> int:
    """Restore from `path` if it exists; the epoch to start from (0 if not)."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"] + 1
