"""The torch and Python the course runs on: checked at `import ddp_teach`,
with shims where the course's torch renamed what older ones already had.

The course is written against torch 2.13. Learners arrive with the torch
their platform has (Colab, Kaggle, a JupyterHub, a laptop), so
`import ddp_teach` checks the versions first: a torch or Python older than
the oldest known good one is an ImportError that names the version found,
the Python it was found in (`sys.executable`) and the command that fixes it;
one newer than the newest known good one is a warning, once, with the same
details.

The oldest known good torch is 2.9, found by running the unit tests under
older ones. Under 2.8, gloo's `reduce_scatter_tensor` sums whatever op it is
given (MAX and PRODUCT came back as sums), and torch's own FSDP2 on the CPU
trained to parameters up to 0.08 away from those of 2.9 and 2.13 (five steps
of tests/course/test_fsdp_precision.py), which equal the course's FSDP to
the bit. Under 2.6, gloo's `destroy_process_group` hung now and then (about
one run in fifteen at four ranks), FSDP2 failed on the CPU, c10d's
collectives had no Meta kernels and DDP no `init_sync`; the libuv TCPStore
that `dt.run` uses serves on a socket it is handed only from 2.8
(pytorch/pytorch#150215). 2.7 was not run.

What changed between 2.9 and 2.13, from torch's own source and pull
requests, and what this module does about it:

- torch 2.13 renamed the single-tensor collectives: `all_gather_into_tensor`
  became `all_gather_single` and `reduce_scatter_tensor` became
  `reduce_scatter_single` (pytorch/pytorch#186123, "Rename distributed
  collective ops to _single naming scheme"); the old names stay as
  deprecated aliases; the old names date from torch 1.13 (pytorch/pytorch
  #85686 for the all-gather). The course calls the new names; on an older
  torch `install_shims` gives `torch.distributed` the new names, each
  calling the old function with the same arguments, and `traced_name`
  gives torch's own calls of the old names the new names in a trace.
- torch 2.13 added DistributedDataParallel's `forward_sync_buffers` and
  deprecated `broadcast_buffers` (torch/nn/parallel/distributed.py). Both
  turn off the copy of rank 0's buffers at every forward; only at
  construction do they differ (`broadcast_buffers=False` also skips the
  first copy). `DDP_BUFFER_SYNC_ARGUMENT` is the name this torch takes.
- torch 2.11 gave c10d's collectives kernels for meta tensors at `import
  torch` (torch/distributed/_meta_registrations.py); in 2.9 and 2.10 the
  same registrations run when torch.distributed._tools.fake_collectives is
  imported, which takes a second, so `register_meta_collectives` does it
  only for what needs it (`dt.sim.one_rank`: a step on meta tensors over
  the fake process group).

- gloo carries the list form of `all_to_all` in torch 2.13, not in 2.9
  ("Backend gloo does not support alltoall"; it always had
  `all_to_all_single`). On a torch older than 2.13 `install_shims` wraps
  `all_to_all` so that, where the backend refuses the list form, a blocking
  call runs as one `all_to_all_single` of the concatenated tensors.

This file runs before anything else of the package, so it must stay
importable on the oldest Pythons a learner may start it with.
"""
import os
import platform
import re
import sys
import warnings

PYTHON_OLDEST = (3, 11)  # known good, inclusive
PYTHON_NEWEST = (3, 13)
TORCH_OLDEST = (2, 9)
TORCH_NEWEST = (2, 14)
# set once the untested-version warning was shown, so that the processes a
# session starts (the fork server, torchrun's workers) do not repeat it
WARNED_ENV = "DDP_TEACH_UNTESTED_VERSION_WARNED"


class UntestedVersionWarning(UserWarning):
    """torch or Python is newer than any the course was tested with."""


def version_tuple(text: str) -> tuple:
    """(major, minor) of a version string such as "2.6.0+cu124" or
    "2.14.0a0+git1234"; ValueError when it has none."""
    found = re.match(r"\s*(\d+)\.(\d+)", str(text))
    if found is None:
        raise ValueError(f"cannot read a version number from {text!r}")
    return int(found.group(1)), int(found.group(2))


def _dotted(pair: tuple) -> str:
    return f"{pair[0]}.{pair[1]}"


def torch_requirement() -> str:
    """The pip requirement for a known-good torch."""
    return f"torch>={_dotted(TORCH_OLDEST)},<{TORCH_NEWEST[0]}.{TORCH_NEWEST[1] + 1}"


def _torch_fix() -> str:
    requirement = torch_requirement()
    return (f"Install a known-good torch into this same Python, then restart "
            f"it (in Jupyter: Kernel > Restart Kernel):\n"
            f"    {sys.executable} -m pip install \"{requirement}\"\n"
            f"or, in a notebook cell: %pip install \"{requirement}\"")


def check_python(version: str) -> None:
    """ImportError for a Python older than PYTHON_OLDEST; a warning for one
    newer than PYTHON_NEWEST."""
    found = version_tuple(version)
    known = f"Python {_dotted(PYTHON_OLDEST)} to {_dotted(PYTHON_NEWEST)}"
    where = f"This is Python {version}, at {sys.executable}."
    if found < PYTHON_OLDEST:
        raise ImportError(
            f"ddp_teach needs Python {_dotted(PYTHON_OLDEST)} or newer "
            f"(known good: {known}). {where}\n"
            f"Make an environment with a newer Python and install the course "
            f"there, e.g. from the repository's folder:\n"
            f"    python3.12 -m venv .venv && .venv/bin/python -m pip install -e .\n"
            f"or with conda: conda env create -f environment.yml")
    if found > PYTHON_NEWEST:
        _warn_untested(
            f"ddp_teach is known to work on {known}. {where} It will "
            f"probably work; if something fails, use Python "
            f"{_dotted(PYTHON_NEWEST)}:\n"
            f"    python{_dotted(PYTHON_NEWEST)} -m venv .venv && "
            f".venv/bin/python -m pip install -e .")


def check_torch(version: str) -> None:
    """ImportError for a torch older than TORCH_OLDEST; a warning for one
    newer than TORCH_NEWEST."""
    found = version_tuple(version)
    known = f"torch {_dotted(TORCH_OLDEST)} to {_dotted(TORCH_NEWEST)}"
    where = f"The Python at {sys.executable} has torch {version}."
    if found < TORCH_OLDEST:
        raise ImportError(
            f"ddp_teach needs torch {_dotted(TORCH_OLDEST)} or newer (known "
            f"good: {known}). {where}\n{_torch_fix()}")
    if found > TORCH_NEWEST:
        _warn_untested(
            f"ddp_teach is known to work with {known}. {where} It will "
            f"probably work; if something fails:\n{_torch_fix()}")


def _warn_untested(message: str) -> None:
    if os.environ.get(WARNED_ENV):
        return
    os.environ[WARNED_ENV] = "1"
    warnings.warn(message, UntestedVersionWarning, stacklevel=3)


def check_versions() -> None:
    """Check this Python, then this torch (the first thing `import ddp_teach`
    does)."""
    check_python(platform.python_version())
    try:
        import torch
    except ModuleNotFoundError as missing:
        if missing.name != "torch":  # torch is there, but broken: say so
            raise
        raise ImportError(
            f"ddp_teach needs torch, and the Python at {sys.executable} has "
            f"none. {_torch_fix()}") from missing
    check_torch(torch.__version__)


check_versions()

import torch  # noqa: E402  (only once the check has passed)
import torch.distributed as dist  # noqa: E402

TORCH = version_tuple(torch.__version__)
COLLECTIVES_HAVE_META_KERNELS = TORCH >= (2, 11)
DDP_BUFFER_SYNC_ARGUMENT = ("forward_sync_buffers" if TORCH >= (2, 13)
                            else "broadcast_buffers")
# torch 2.13's name -> the name older releases have (see the docstring)
RENAMED_COLLECTIVES = {"all_gather_single": "all_gather_into_tensor",
                       "reduce_scatter_single": "reduce_scatter_tensor"}


def install_shims(modules=None) -> list:
    """Give an older torch.distributed the collectives' 2.13 names; returns
    the names added (none on torch 2.13 and later). `modules` are where to
    add them, the first holding the old names (default: torch's
    distributed_c10d, where torch's own code looks them up, and
    torch.distributed). Each new name calls the function found under the old
    one now, before any tracing wraps it, so a traced call is recorded once."""
    if modules is None:
        if not dist.is_available():
            return []
        import torch.distributed.distributed_c10d as c10d
        modules = (c10d, dist)
    added = []
    for new, old in RENAMED_COLLECTIVES.items():
        if not hasattr(modules[0], new):
            shim = _SHIM_MAKERS[new](getattr(modules[0], old))
            for module in modules:
                setattr(module, new, shim)
            added.append(new)
    all_to_all = getattr(modules[0], "all_to_all", None)
    if TORCH < (2, 13) and all_to_all and not getattr(all_to_all, "list_form_shim", False):
        shim = all_to_all_shim(all_to_all, modules[0].all_to_all_single)
        for module in modules:
            module.all_to_all = shim
        added.append("all_to_all")
    return added


def traced_name(name: str) -> str:
    """The name a trace gives the torch.distributed call `name`: torch
    2.13's on every torch, so that a timeline of torch's own FSDP2 (which
    calls the old names before 2.13) reads the same everywhere."""
    if TORCH < (2, 13):
        return {old: new for new, old in RENAMED_COLLECTIVES.items()}.get(name, name)
    return name


def called_name(name: str) -> str:
    """The name under which this torch's own code (FSDP2, DTensor) calls the
    torch.distributed collective that torch 2.13 names `name`: the old name
    before 2.13. A wrapper that counts torch's calls wraps this one."""
    if TORCH < (2, 13):
        return RENAMED_COLLECTIVES.get(name, name)
    return name


def register_meta_collectives() -> None:
    """Let c10d's collectives run on meta tensors (already so from torch
    2.11; see the module's docstring)."""
    if not COLLECTIVES_HAVE_META_KERNELS:
        import torch.distributed._tools.fake_collectives  # noqa: F401


def _all_gather_single_shim(all_gather_into_tensor):
    def all_gather_single(output_tensor, input_tensor, group=None,
                          async_op=False):
        """torch 2.13's name for all_gather_into_tensor (added by
        ddp_teach.compat on this older torch)."""
        return all_gather_into_tensor(output_tensor, input_tensor, group,
                                      async_op)
    return all_gather_single


def _reduce_scatter_single_shim(reduce_scatter_tensor):
    def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None,
                              async_op=False):
        """torch 2.13's name for reduce_scatter_tensor (added by
        ddp_teach.compat on this older torch)."""
        return reduce_scatter_tensor(output, input, op, group, async_op)
    return reduce_scatter_single


def all_to_all_shim(all_to_all, all_to_all_single):
    """`all_to_all` that falls back on `all_to_all_single` where the backend
    refuses the list form (see the module's docstring)."""
    def all_to_all_list(output_tensor_list, input_tensor_list, group=None,
                        async_op=False):
        """torch's all_to_all; where the backend has no list form (gloo
        before torch 2.13), a blocking call runs as one all_to_all_single
        (added by ddp_teach.compat on this older torch)."""
        try:
            return all_to_all(output_tensor_list, input_tensor_list, group, async_op)
        except RuntimeError as refused:
            if async_op or "does not support alltoall" not in str(refused):
                raise
        received = torch.empty(sum(t.numel() for t in output_tensor_list),
                               dtype=output_tensor_list[0].dtype,
                               device=output_tensor_list[0].device)
        all_to_all_single(received, torch.cat([t.reshape(-1) for t in input_tensor_list]),
                          [t.numel() for t in output_tensor_list],
                          [t.numel() for t in input_tensor_list], group)
        for out, piece in zip(output_tensor_list,
                              received.split([t.numel() for t in output_tensor_list])):
            out.copy_(piece.view_as(out))
        return None
    all_to_all_list.list_form_shim = True
    return all_to_all_list


_SHIM_MAKERS = {"all_gather_single": _all_gather_single_shim,
                "reduce_scatter_single": _reduce_scatter_single_shim}

install_shims()
