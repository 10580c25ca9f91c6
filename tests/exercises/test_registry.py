"""One test over every registered exercise: the course's reference (adapted
to the exercise's signature where it differs) is correct, a stub that still
raises NotImplementedError reads as not attempted, and every exercise has
planted mistakes, each caught with the hint that fits it.

The planted mistakes live beside the notebook's other tests: each
test_nbNN_*.py has a PLANTED list of (exercise, planted function, hint),
the hint a string or a tuple of strings that the verdict must all show."""
import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from ddp_teach import exercises
from ddp_teach.exercises import registry

NAMES = exercises.exercise_names()
NOTEBOOKS = Path(__file__).parents[2] / "notebooks"
PLANTED = [entry for path in sorted(Path(__file__).parent.glob("test_nb*.py"))
           for entry in importlib.import_module(path.stem).PLANTED]


def stub(*args):
    raise NotImplementedError("your turn")


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_correct(name, verdict):
    passed, seen = verdict(name, exercises.reference_solution(name))
    assert passed and "✅" in seen, seen


@pytest.mark.parametrize("name", NAMES)
def test_a_stub_is_not_attempted(name, verdict):
    passed, seen = verdict(name, stub)
    assert not passed and "⏳" in seen and registry.NOT_ATTEMPTED in seen, seen
    assert registry.TODO_MESSAGE in seen, seen


def test_every_exercise_has_planted_mistakes():
    planted = {name for name, _, _ in PLANTED}
    assert not set(NAMES) - planted, f"no planted mistake: {set(NAMES) - planted}"
    assert planted <= set(NAMES), f"unknown exercises: {planted - set(NAMES)}"


@pytest.mark.parametrize("name, planted, hint", PLANTED,
                         ids=[f"{n}-{getattr(p, '__name__', 'lambda')}"
                              for n, p, _ in PLANTED])
def test_each_planted_mistake_gets_the_hint_that_fits(name, planted, hint, verdict):
    passed, seen = verdict(name, planted)
    assert not passed and "❌" in seen, seen
    for text in (hint,) if isinstance(hint, str) else hint:
        assert text in seen, (text, seen)



def notebook_stub_parameters() -> dict[str, set[tuple[str, ...]]]:
    """The parameters of every `def name(...)` in the notebooks' code cells,
    by name: what each exercise cell gives the learner."""
    found = {}
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for match in re.finditer(r"^def (\w+)\(([^)]*)\)", "".join(cell["source"]),
                                     re.MULTILINE):
                arguments = ast.parse(f"def f({match[2]}): pass").body[0].args
                found.setdefault(match[1], set()).add(
                    tuple(a.arg for a in arguments.args))
    return found


IN_NOTEBOOKS = notebook_stub_parameters()


def test_each_exercise_cell_defines_the_parameters_the_checker_passes():
    for name in NAMES:
        exercise = exercises.exercise_named(name)
        assert IN_NOTEBOOKS.get(exercise.stub_name) == {
            exercise.stub_parameter_names()}, name


def with_one_parameter_too_many(parameters):
    """A function taking `parameters` and `extra`: the checker's call would
    fail, so it must not be made (the body says if it is)."""
    def learner_function(*args):
        raise AssertionError("called despite its signature")
    learner_function.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in parameters + ("extra",)])
    return learner_function


@pytest.mark.parametrize("name", NAMES)
def test_a_function_with_other_parameters_is_told_the_signature_and_no_hint(
        name, verdict):
    stub_name = exercises.exercise_named(name).stub_name
    [parameters] = IN_NOTEBOOKS[stub_name]
    passed, seen = verdict(name, with_one_parameter_too_many(parameters))
    assert not passed and "❌" in seen, seen
    assert (f"the checker calls {stub_name}({', '.join(parameters)}), as the "
            f"exercise cell defines it, but your function is "
            f"learner_function(") in seen, seen
    assert "missing a required argument: 'extra'" in seen, seen
    assert "Hint" not in seen and "called despite" not in seen, seen


def test_a_ring_allreduce_taking_the_world_size_gets_no_hint_about_one_rank(verdict):
    """The mistake of issue 19: before, the TypeError from rank 0 came with
    the hint for a single rank, which had nothing to do with it."""
    def my_ring_allreduce(tensor, world_size):
        return tensor
    passed, seen = verdict("ring_allreduce", my_ring_allreduce)
    assert not passed, seen
    assert ("the checker calls my_ring_allreduce(tensor), as the exercise cell "
            "defines it, but your function is my_ring_allreduce(tensor, "
            "world_size), which cannot be called so (missing a required "
            "argument: 'world_size')") in seen, seen
    assert "Hint" not in seen and "return early when world_size == 1" not in seen


def raising_with_the_cells_signature(parameters):
    """A function with the exercise cell's parameters that fails at once,
    as a learner's first try often does."""
    def learner_function(*args):
        return 1 / 0
    learner_function.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in parameters])
    return learner_function


def my_main():
    """torchrun_script's learner function must be importable by name (it
    becomes a script), so its failing version is defined here, at the top."""
    return 1 / 0


@pytest.mark.parametrize("name", NAMES)
def test_an_error_in_the_learners_function_is_a_verdict_never_raised(name, verdict):
    [parameters] = IN_NOTEBOOKS[exercises.exercise_named(name).stub_name]
    failing = (my_main if name == "torchrun_script"
               else raising_with_the_cells_signature(parameters))
    passed, seen = verdict(name, failing)
    assert not passed and "❌" in seen, seen
    assert "ZeroDivisionError" in seen, seen
