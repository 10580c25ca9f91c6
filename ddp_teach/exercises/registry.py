"""The exercise registry: what an exercise is, and what a check concludes.

Each checker module (nbNN_*.py, named after its notebook) registers its
exercises here when it is imported.
"""
import importlib
from dataclasses import dataclass, field

NOT_ATTEMPTED, WRONG, CORRECT = "not attempted", "wrong", "correct"
TODO_MESSAGE = ("the function still raises NotImplementedError: fill it in, "
                "then run this cell again.")


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


def register(exercise: Exercise) -> Exercise:
    REGISTRY[exercise.name] = exercise
    return exercise
