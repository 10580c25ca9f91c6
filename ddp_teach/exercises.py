"""Exercises checked on the spot: `dt.exercises.check("ring_allreduce", fn)`.

A learner writes a function in a cell; `check` runs it on real worker
processes, over several world sizes, tensor lengths and dtypes, compares it
with the course's own reference, and answers in the learner's terms: not
attempted yet (the stub still raises NotImplementedError), wrong (which rank,
which input, expected against got, and a hint that fits the mistake), or
correct (what was tried). It never raises, so a notebook with unsolved
exercises still runs top to bottom; it returns True only when correct.

The checkers live in the `exercise_checks*` modules; this module is the
registry and the three calls a notebook uses: `check`, `hint`, `solution`.
"""
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field

NOT_ATTEMPTED, WRONG, CORRECT = "not attempted", "wrong", "correct"
TODO_MESSAGE = ("the function still raises NotImplementedError: fill it in, "
                "then run this cell again.")
_MARK = {NOT_ATTEMPTED: "⏳", WRONG: "❌", CORRECT: "✅"}


@dataclass
class Verdict:
    """What a checker found; `message` is written for the learner."""
    status: str
    message: str


@dataclass
class Exercise:
    """One exercise: what the learner's cell defines, how it is checked, and
    the reference solution (`module:function`) that a skipped cell falls back
    on and that `solution()` shows."""
    name: str
    title: str
    stub_name: str
    reference: str
    checker: object  # callable(fn) -> Verdict
    hints: list[str] = field(default_factory=list)

    def reference_function(self):
        module, function = self.reference.split(":")
        return getattr(importlib.import_module(module), function)


REGISTRY: dict[str, Exercise] = {}


def run_learner_code(worker, world_size: int, fn, timeout: float = 10.0,
                     trace: bool = False):
    """Run a checker's `worker(rank, world_size, fn)` on real ranks. Returns
    (results, None), or (None, Verdict) when the learner's code raised, hung
    or is still a stub (the worker then returns NOT_ATTEMPTED)."""
    from ddp_teach.errors import WorkerError
    from ddp_teach.launcher import run
    try:
        results = run(worker, world_size, args=(fn,), timeout=timeout, trace=trace)
    except WorkerError as err:  # a WorkerTimeout too
        return None, Verdict(WRONG, f"on {world_size} ranks:\n{err}")
    if NOT_ATTEMPTED in results:
        return None, Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
    return results, None


def register(exercise: Exercise) -> Exercise:
    REGISTRY[exercise.name] = exercise
    return exercise


def _load_checkers() -> None:
    """Import every `ddp_teach.exercise_checks*` module: each registers its
    exercises when imported, so a new notebook's checkers need no edit here."""
    import ddp_teach
    for module in pkgutil.iter_modules(ddp_teach.__path__):
        if module.name.startswith("exercise_checks"):
            importlib.import_module(f"ddp_teach.{module.name}")


def _exercise(name: str) -> Exercise:
    _load_checkers()
    if name not in REGISTRY:
        raise KeyError(f"no exercise named {name!r}; the exercises are: "
                       f"{', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check(name: str, fn) -> bool:
    """Check the learner's `fn` for exercise `name`; print the verdict."""
    exercise = _exercise(name)
    if not callable(fn):
        verdict = Verdict(WRONG, f"expected a function ({exercise.stub_name}), "
                                 f"got a {type(fn).__name__}")
    else:
        verdict = exercise.checker(fn)
    print(f"{_MARK[verdict.status]} {exercise.title}: {verdict.status}")
    print(verdict.message)
    if verdict.status == NOT_ATTEMPTED:
        print(f"(Stuck? dt.exercises.hint({name!r}) gives a hint.)")
    return verdict.status == CORRECT


def hint(name: str) -> None:
    """Print the exercise's hints, from gentle to explicit."""
    exercise = _exercise(name)
    for number, text in enumerate(exercise.hints, 1):
        print(f"Hint {number}: {text}")


def solution(name: str) -> None:
    """Print the reference solution's source (try the exercise first!)."""
    print(inspect.getsource(_exercise(name).reference_function()))


def solution_cell(name: str) -> str:
    """A cell that defines the learner's function as the reference: what a
    solved notebook runs in place of the exercise cell (used by the tests)."""
    exercise = _exercise(name)
    module, function = exercise.reference.split(":")
    return f"from {module} import {function} as {exercise.stub_name}"
