"""Checker for notebook 07's checkpoint exercise, on 2 real ranks.

`my_save_checkpoint(model, optimizer, epoch, path)`, called by every rank
at the end of an epoch. What the reference,
`ddp_teach.checkpoint.save_checkpoint`, guarantees, and how each property
is checked (`torch.save` is watched: who writes, to which file):

- one writer: only rank 0 writes; N processes writing one file would
  corrupt it;
- one writer by the global rank: the ranks run as two nodes of one
  process each (LOCAL_RANK 0 on both: dt.run would set it to RANK), so a
  writer chosen by LOCAL_RANK writes twice;
- atomic: the previous epoch's checkpoint is on disk before the call; at
  the end of every torch.save (where a killed worker would stop) it must
  still be there, whole, and afterwards `path` must be another file (a
  rename), not the same one rewritten: writing into `path`, through an
  open file or by copying a temporary file onto it all fail;
- nobody goes on early: when a rank returns, the checkpoint is complete on
  disk. Rank 0's disk is made slow: its `torch.save` does not write until
  rank 1 has returned (or 1.5 s have passed), so a rank that does not wait
  at a barrier finds no checkpoint, however the processes are scheduled;
- every rank takes part: a barrier that only rank 0 calls waits for ever
  (the checker reports the hang and names it);
- what a restart needs: `torch.load(path, weights_only=True)`, as
  `load_checkpoint` reads it, gives {"model": the model's state_dict,
  "optimizer": the optimizer's state_dict (its momentum is state too),
  "epoch": the epoch given}.

It runs on 2 ranks only: the slow disk needs a rank that returns while
rank 0 writes, and no mistake of this exercise shows on one rank alone.
The ranks' own end is synchronised through files, not a collective, so a
learner's mismatched barrier is not matched by one of the checker's.
"""
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

SLOW_DISK_S = 1.5
RUN_TIMEOUT_S = 15.0
EPOCH = 3


def _wait_for(path, seconds) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def _load(path):
    """What a restart would load, or why it cannot."""
    if not os.path.exists(path):
        return None, None
    try:
        return torch.load(path, weights_only=True), None
    except Exception as err:  # the learner's file, not the checker's fault
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"


def _target_name(f) -> str:
    """The file torch.save writes: a path, or an open file object's name."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.basename(os.fspath(f))
    return os.path.basename(str(getattr(f, "name", repr(f))))


def _inode(path):
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _still_previous(path, previous_inode) -> bool:
    """Whether `path` is still the previous checkpoint, whole: the same
    file, and it loads as the previous epoch."""
    seen, _ = _load(path)
    return (_inode(path) == previous_inode and isinstance(seen, dict)
            and seen.get("epoch") == EPOCH - 1)


def _save_on_ranks(rank, world_size, fn, path):
    # two nodes of one process each: LOCAL_RANK is 0 on both ranks, and
    # only the global rank tells the writer (dt.run sets LOCAL_RANK = RANK)
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()  # momentum buffers: state the optimizer must keep
    writes, real_save = [], torch.save
    returned = f"{path}.rank{rank}-returned"
    previous = _inode(path)  # the last epoch's checkpoint, put there by the checker
    in_place = []

    def watched_save(obj, f, *args, **kwargs):
        writes.append(_target_name(f))
        if rank == 0:  # a slow disk: it writes once rank 1 went on, or late
            _wait_for(f"{path}.rank1-returned", SLOW_DISK_S)
        real_save(obj, f, *args, **kwargs)
        # a worker killed here must leave the previous checkpoint whole
        in_place.append(not _still_previous(path, previous))

    torch.save = watched_save
    try:
        fn(model, opt, EPOCH, path)
    except NotImplementedError:
        return NOT_ATTEMPTED
    finally:
        torch.save = real_save
    seen, unloadable = _load(path)  # right after the save returned: is it there?
    replaced = _inode(path) != previous
    open(returned, "w").close()
    for other in range(world_size):  # stay until every rank is done
        _wait_for(f"{path}.rank{other}-returned", 2 * RUN_TIMEOUT_S)
    return {"writes": writes, "seen": seen, "unloadable": unloadable,
            "in_place": any(in_place), "replaced": replaced,
            "model": model.state_dict(), "optimizer": opt.state_dict()}


def _previous_checkpoint(path) -> None:
    """The last epoch's checkpoint, on disk before the save is called."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "epoch": EPOCH - 1}, path)


def _on_hang(err, world_size, timeout) -> str:
    waiting = {rank: call for rank, call in err.in_collective.items() if call}
    if waiting.get(0) == "barrier" and 1 not in waiting:
        hint = ("rank 0 waited in dist.barrier(), which rank 1 never called: "
                "every rank calls it, after (and outside) the `if rank == 0:` "
                "block.")
    else:
        hint = "every rank must make the same collective calls, in the same order."
    where = ", ".join(f"rank {r} in {c}()" for r, c in sorted(waiting.items()))
    return (f"your function did not finish within {timeout:g} s on "
            f"{world_size} ranks: {where or 'no rank was in a collective'}."
            f"\nHint: {hint}")


def _content_hint(state, zero) -> str | None:
    if not isinstance(state, dict):
        return (f"the checkpoint holds a {type(state).__name__}, not a dict.\n"
                f"Hint: save {{\"model\": ..., \"optimizer\": ..., \"epoch\": "
                f"...}}.")
    if state.get("epoch") != EPOCH:
        return (f"the checkpoint's epoch is {state.get('epoch')!r}, and the "
                f"function was given epoch={EPOCH}.\nHint: save the epoch you "
                f"were given; load_checkpoint resumes at the one after it.")
    if not _equal(state.get("model"), zero["model"]):
        return ("the checkpoint's \"model\" is not the model's state_dict().\n"
                "Hint: save model.state_dict().")
    if not _equal(state.get("optimizer"), zero["optimizer"]):
        return ("the checkpoint does not hold the optimizer's state_dict().\n"
                "Hint: save optimizer.state_dict() too: the optimizer's "
                "momentum is state too, and a restart without it trains on "
                "differently.")
    return None


def check_checkpoint_save(fn) -> Verdict:
    work = tempfile.mkdtemp(prefix="checkpoint-check-")
    try:
        _previous_checkpoint(os.path.join(work, "ckpt.pt"))
        results, problem = run_learner_code(
            _save_on_ranks, 2, fn, timeout=RUN_TIMEOUT_S,
            args=(os.path.join(work, "ckpt.pt"),), on_hang=_on_hang)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if problem:
        return problem
    zero, one = results
    if one["writes"]:
        return Verdict(WRONG, "rank 1 wrote too. Here the two ranks run on two "
                       "nodes, one process each: LOCAL_RANK is 0 on both, RANK "
                       "is 0 and 1.\nHint: every rank holds the same model; "
                       "only rank 0 writes (the global rank: if "
                       "dist.get_rank() == 0:, not LOCAL_RANK, which is 0 once "
                       "per node), or N "
                       "processes write one file at once.")
    if not zero["writes"]:
        return Verdict(WRONG, "nothing was written.\nHint: rank 0 calls "
                       "torch.save(state, ...).")
    if one["seen"] is None and one["unloadable"] is None or \
            isinstance(one["seen"], dict) and one["seen"].get("epoch") == EPOCH - 1:
        return Verdict(WRONG, "rank 1 went on before the checkpoint was on "
                       "disk (rank 0's disk was slow).\nHint: every rank calls "
                       "dist.barrier() after rank 0's save.")
    if zero["in_place"]:
        return Verdict(WRONG, "while rank 0's torch.save wrote, the "
                       "checkpoint's own file no longer held the last epoch's "
                       "checkpoint: a worker killed mid-write leaves half a "
                       "file (or none), and the restart cannot load it.\nHint: "
                       "save to f\"{path}.tmp\", then os.replace(tmp, path), "
                       "which renames in one step.")
    if not zero["replaced"]:
        return Verdict(WRONG, "the checkpoint's file was rewritten in place "
                       "(copied onto? shutil.copyfile writes it byte by "
                       "byte), not renamed onto: a worker killed mid-copy "
                       "leaves half a file.\nHint: os.replace(tmp, path) puts "
                       "the finished file there in one step.")
    if one["unloadable"]:
        return Verdict(WRONG, f"the checkpoint cannot be loaded as a restart "
                       f"loads it, torch.load(path, weights_only=True): "
                       f"{one['unloadable']}\nHint: save the state_dict()s "
                       f"of the model and the optimizer (tensors, numbers, "
                       f"dicts), not the objects themselves.")
    wrong = _content_hint(one["seen"], zero)
    if wrong:
        return Verdict(WRONG, wrong)
    return Verdict(CORRECT, "only rank 0 wrote, through a temporary file; "
                   "rank 1 waited until the checkpoint (model, optimizer, "
                   "epoch) was complete on disk, and it loads as a restart "
                   "loads it.")


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


register(Exercise(
    "checkpoint_save", "A checkpoint that survives a restart",
    "my_save_checkpoint", "ddp_teach.checkpoint:save_checkpoint",
    check_checkpoint_save,
    ["One file for the whole job, written by rank 0 only; the others wait.",
     "Write to a temporary name, then os.replace() it onto the real one.",
     "if dist.get_rank() == 0: torch.save({...}, tmp); os.replace(tmp, "
     "path) — then dist.barrier() on every rank."]))
