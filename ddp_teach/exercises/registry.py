"""The exercise registry: what an exercise is, and what a check concludes.

Each checker module (nbNN_*.py, named after its notebook) registers its
exercises here when it is imported.
"""
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

NOT_ATTEMPTED, WRONG, CORRECT = "not attempted", "wrong", "correct"
# the one "not attempted" message: every checker says this to a stub
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
    the reference solution (`module:function`, in a course module) that a
    skipped cell falls back on and that `solution()` shows.

    `adapt`, when the exercise's signature is not the course function's
    (`fit_alpha_beta` returns a Link, the exercise (alpha, beta)): a function
    that turns the course function into one with the learner's signature,
    so that the reference is written once, in the course.

    `stub_parameters`, when the exercise cell's function takes more than the
    reference's parameters without a default (the checker passes them all,
    in that order): their names."""
    name: str
    title: str
    stub_name: str
    reference: str
    checker: Callable  # checker(fn) -> Verdict
    hints: list[str] = field(default_factory=list)
    adapt: Callable | None = None
    stub_parameters: tuple[str, ...] | None = None

    def reference_function(self) -> Callable:
        """The course function named by `reference`, as it is."""
        module, function = self.reference.split(":")
        return getattr(importlib.import_module(module), function)

    def reference_solution(self) -> Callable:
        """The reference with the learner's signature (adapted if need be):
        what `check` must call correct."""
        function = self.reference_function()
        return function if self.adapt is None else self.adapt(function)

    def stub_parameter_names(self) -> tuple[str, ...]:
        """The parameters of the exercise cell's function, which the checker
        passes positionally: `stub_parameters`, or else the reference's
        (adapted) parameters that have no default."""
        if self.stub_parameters is not None:
            return self.stub_parameters
        positional = (inspect.Parameter.POSITIONAL_ONLY,
                      inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(p.name for p in inspect.signature(
            self.reference_solution()).parameters.values()
            if p.kind in positional and p.default is inspect.Parameter.empty)

    def stub_signature(self) -> str:
        """How the exercise cell defines the function: "my_finish(buckets,
        world_size)"."""
        return f"{self.stub_name}({', '.join(self.stub_parameter_names())})"


REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    REGISTRY[exercise.name] = exercise
    return exercise
