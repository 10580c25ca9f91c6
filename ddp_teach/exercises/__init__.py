"""Exercises checked on the spot: `dt.exercises.check("ring_allreduce", fn)`.

A learner writes a function in a cell; `check` runs it on real worker
processes, over several world sizes, tensor lengths and dtypes, compares it
with the course's own reference, and answers in the learner's terms: not
attempted yet (the stub still raises NotImplementedError), wrong (which rank,
which input, expected against got, and a hint that fits the mistake), or
correct (what was tried). It never raises, so a notebook with unsolved
exercises still runs top to bottom; it returns True only when correct.

Each notebook's checkers live in a module named after it (nb03_ddp.py for
03_ddp.ipynb, nbA1_cost_models.py for A1_cost_models.ipynb); `registry` says
what an exercise is, `harness` runs learner code on ranks; this module holds
the calls a notebook uses: `check`, `hint`, `solution`, and
`reference_solution` (the reference a solved notebook uses). The references
themselves live in the course modules (ddp_teach/*.py).
"""
import importlib
import inspect
import pkgutil
import traceback

from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, REGISTRY, WRONG,
                                         Exercise, Verdict)

_MARK = {NOT_ATTEMPTED: "⏳", WRONG: "❌", CORRECT: "✅"}


def _load_checkers() -> None:
    """Import every checker module (nbNN_*.py): each registers its exercises
    when imported, so a new notebook's checkers need no edit here."""
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("nb"):
            importlib.import_module(f"{__name__}.{module.name}")


def exercise_names() -> list[str]:
    """Every registered exercise's name, sorted (every checker loaded)."""
    _load_checkers()
    return sorted(REGISTRY)


def exercise_named(name: str) -> Exercise:
    """The registered exercise called `name` (every checker loaded), or a
    KeyError that lists the names there are."""
    _load_checkers()
    if name not in REGISTRY:
        raise KeyError(f"no exercise named {name!r}; the exercises are: "
                       f"{', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def _wrong_signature(exercise: Exercise, fn) -> str | None:
    """Why `fn` cannot be called as the exercise cell's function is, or None.

    Why first: the checker would call it anyway, and the TypeError would
    come from inside the checker, on ranks, followed by a hint meant for
    another mistake (one rank alone, say)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # none to read (some builtins): the checker tries it
        return None
    try:
        signature.bind(*exercise.stub_parameter_names())
    except TypeError as mismatch:
        return (f"the checker calls {exercise.stub_signature()}, as the exercise "
                f"cell defines it, but your function is "
                f"{getattr(fn, '__name__', exercise.stub_name)}{signature}, which "
                f"cannot be called so ({mismatch}). Give it the exercise cell's "
                f"parameters, in that order, then run this cell again.")
    return None


def _run_checker(exercise: Exercise, fn) -> Verdict:
    """The checker's verdict. The checkers that run learner code on ranks
    turn its errors into verdicts; those that call it here may let one
    through, and `check` must not raise: that error is the verdict."""
    try:
        return exercise.checker(fn)
    except Exception as error:  # the learner's code raised inside the checker
        return Verdict(WRONG, f"your function raised {type(error).__name__}: "
                              f"{error}{_learner_line(fn, error)}. Fix that, "
                              f"then run this cell again.")


def _learner_line(fn, error: Exception) -> str:
    """" (line 5: return idx[length])": the last line of the learner's own
    code in the error's traceback (not torch's, nor the checker's)."""
    frames = traceback.extract_tb(error.__traceback__)
    code = getattr(fn, "__code__", None)
    mine = [f for f in frames if code is not None and f.filename == code.co_filename]
    if not mine:
        return ""
    where = mine[-1]
    return f" (line {where.lineno}: {where.line})" if where.line else f" (line {where.lineno})"


def check(name: str, fn) -> bool:
    """Check the learner's `fn` for exercise `name`; print the verdict."""
    exercise = exercise_named(name)
    if not callable(fn):
        verdict = Verdict(WRONG, f"expected a function ({exercise.stub_name}), "
                                 f"got a {type(fn).__name__}")
    elif (mismatch := _wrong_signature(exercise, fn)) is not None:
        verdict = Verdict(WRONG, mismatch)
    else:
        verdict = _run_checker(exercise, fn)
    print(f"{_MARK[verdict.status]} {exercise.title}: {verdict.status}")
    print(verdict.message)
    if verdict.status == NOT_ATTEMPTED:
        print(f"(Stuck? dt.exercises.hint({name!r}) gives a hint.)")
    return verdict.status == CORRECT


def hint(name: str) -> None:
    """Print the exercise's hints, from gentle to explicit."""
    exercise = exercise_named(name)
    for number, text in enumerate(exercise.hints, 1):
        print(f"Hint {number}: {text}")


def reference_solution(name: str):
    """The course's reference for exercise `name`, callable as the learner's
    function is (adapted when the course function's signature differs)."""
    return exercise_named(name).reference_solution()


def solution(name: str) -> None:
    """Print the reference solution's source (try the exercise first!); for
    an adapted reference, also how it is called with the exercise's signature."""
    exercise = exercise_named(name)
    print(inspect.getsource(exercise.reference_function()))
    if exercise.adapt is not None:
        print(f"# The exercise's {exercise.stub_name} is "
              f"{exercise.reference.split(':')[1]} called like this "
              f"({exercise.adapt.__name__}):\n")
        print(inspect.getsource(exercise.adapt))


def solution_cell(name: str) -> str:
    """A cell that defines the learner's function as the reference: what a
    solved notebook runs in place of the exercise cell (used by the tests)."""
    exercise = exercise_named(name)
    if exercise.adapt is not None:
        return (f"from ddp_teach.exercises import reference_solution\n"
                f"{exercise.stub_name} = reference_solution({name!r})")
    module, function = exercise.reference.split(":")
    return f"from {module} import {function} as {exercise.stub_name}"
