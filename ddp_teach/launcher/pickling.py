"""Ship a notebook-defined function to the workers, or say what stops it.

`torch.multiprocessing.spawn` pickles the function by reference, and a worker
cannot find a function that only exists in a notebook cell. cloudpickle sends
such functions (and the globals and closure variables they use) by value.
When something they use cannot be pickled (a lock, an open file, a CUDA
stream, a generator), plain pickle's message does not say which object is to
blame; `dumps_call` finds it and names it.
"""
import types

import cloudpickle


def dumps_call(fn, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle (fn, args, kwargs), or a TypeError naming the culprit."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
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
