"""One test over every registered exercise: the course's reference (adapted
to the exercise's signature where it differs) is correct, a stub that still
raises NotImplementedError reads as not attempted, and every exercise has
planted mistakes, each caught with the hint that fits it.

The planted mistakes live beside the notebook's other tests: each
test_nbNN_*.py has a PLANTED list of (exercise, planted function, hint),
the hint a string or a tuple of strings that the verdict must all show."""
import importlib
from pathlib import Path

import pytest

from ddp_teach import exercises
from ddp_teach.exercises import registry

NAMES = exercises.exercise_names()
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
