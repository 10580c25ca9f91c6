"""Ship a notebook-defined function to the workers, or say what stops it.

`torch.multiprocessing.spawn` pickles the function by reference, and a worker
cannot find a function that only exists in a notebook cell. cloudpickle sends
such functions (and the globals and closure variables they use) by value.
When something they use cannot be pickled (a lock, an open file, a CUDA
stream, a generator), plain pickle's message does not say which object is to
blame; `dumps_call` finds it and names it.

A function travels with the name of the file its code came from (for a
notebook, the cell's name in linecache), which is how a worker's traceback
shows the learner's lines. cloudpickle 3.1.3 writes "<dynamic-code>" there
instead, to make its output the same wherever a function was defined
(cloudpickle's `_code_reduce`); `dumps_call` puts the real name back.
"""
import collections
import io
import types

import cloudpickle

_DYNAMIC_CODE = "<dynamic-code>"  # cloudpickle's stand-in for every file name


def _code_keeping_its_file_name(code: types.CodeType):
    """cloudpickle's reduction of a code object, with its file name."""
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    if _DYNAMIC_CODE in args and code.co_filename != _DYNAMIC_CODE:
        where = args.index(_DYNAMIC_CODE)
        args = (*args[:where], code.co_filename, *args[where + 1:])
    return rebuild, args


class _FileNamesKept(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap(
        {types.CodeType: _code_keeping_its_file_name},
        cloudpickle.Pickler.dispatch_table)


def dumps_call(fn, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle (fn, args, kwargs), or a TypeError naming the culprit."""
    try:
        with io.BytesIO() as buffer:
            _FileNamesKept(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(
                (fn, args, kwargs))
            return buffer.getvalue()
    except Exception as exc:
        culprit = _find_unpicklable(fn, args, kwargs) or "the function itself"
        raise TypeError(
            f"cannot send {culprit} to the workers: {type(exc).__name__}: {exc}. "
            "Everything a run uses is pickled and sent to each worker; create "
            "objects such as locks, files, generators or processes inside the "
            "function instead of passing or capturing them.") from exc


def _picklable(obj) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:
        return False


def _describe(label: str, obj) -> str:
    return f"{label} (a {type(obj).__module__}.{type(obj).__qualname__})"


def _candidates(fn, args, kwargs):
    """(label, object) pairs for everything that gets pickled with the call."""
    for i, arg in enumerate(args):
        yield f"positional argument {i} in args", arg
    for key, value in kwargs.items():
        yield f"keyword argument {key!r} in kwargs", value
    if not isinstance(fn, types.FunctionType):
        return
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: nothing to send
            continue
        yield f"the variable {name!r} that {fn.__name__}() captures", value
    for name in sorted(_global_names(fn.__code__)):
        if name in fn.__globals__:
            yield (f"the global {name!r} that {fn.__name__}() uses",
                   fn.__globals__[name])
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"default argument {i} of {fn.__name__}()", default


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _find_unpicklable(fn, args, kwargs) -> str | None:
    for label, obj in _candidates(fn, args, kwargs):
        if isinstance(obj, types.ModuleType):
            continue  # modules go by reference
        if not _picklable(obj):
            return _describe(label, obj)
    return None
