"""Mutants of the references, for the checkers that run in the kernel (no
ranks to start, so every mutant is cheap): each small edit a learner might
make by accident (an integer off by one, a comparison made strict or loose,
== turned into !=, + into -, * into /, and, or swapped, a call's first two
arguments swapped) is applied to the reference's own source, one at a
time, and checked. A mutant the checker calls correct is either equivalent
to the reference or a mistake it misses; the share rejected is printed
(pytest -s) and held above a floor measured when this test was written, so
that a checker that gets weaker fails here.

The checkers that run on ranks are left out: a mutant costs them a few
seconds of worker processes each, too much for the test suite.
"""
import ast
import importlib
import inspect
import textwrap

import pytest

from ddp_teach.exercises import exercise_named
from ddp_teach.exercises.registry import CORRECT

SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
         ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Add: ast.Sub, ast.Sub: ast.Add,
         ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
         ast.And: ast.Or, ast.Or: ast.And}

# exercise: the share of mutants its checker must reject. Measured when
# written: 100% for the sampler, scatter, gather and the loss scale; 75% for
# the buckets (the one left, min(a, b) as min(b, a), is equivalent); 64% for
# the fit (the rest are in its input checks and its non-negative branch,
# which the exercise does not ask for); 45% for the diagnosis (the rest are
# equivalent: > made >= on continuous times, world_size > 1 made > 0 where
# every case has 2 ranks or more, rank 0's row made rank 1's)
FLOORS = {"sampler_split": 0.8, "ddp_bucket_assignment": 0.7,
          "loss_scale_update": 0.8, "dp_scatter": 0.6, "dp_gather": 0.6,
          "fit_alpha_beta": 0.6, "diagnose": 0.4}


def _mutation_sites(tree):
    """(node, what to do to it) for every place one edit can be made in the
    function's body (not its defaults: the checkers pass every argument)."""
    body = tree.body[0].body
    for node in (n for statement in body for n in ast.walk(statement)):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, "plus one"
            if node.value:
                yield node, "minus one"
        elif isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            yield node, "swap operator"
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAPS:
            yield node, "swap comparison"
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            yield node, "swap arguments"


def _mutate(node, how) -> None:
    if how == "plus one":
        node.value += 1
    elif how == "minus one":
        node.value -= 1
    elif how == "swap operator":
        node.op = SWAPS[type(node.op)]()
    elif how == "swap comparison":
        node.ops = [SWAPS[type(node.ops[0])](), *node.ops[1:]]
    else:
        node.args[0], node.args[1] = node.args[1], node.args[0]


def mutants(function):
    """Every one-edit mutant of `function`, compiled in its module's globals."""
    source = textwrap.dedent(inspect.getsource(function))
    count = sum(1 for _ in _mutation_sites(ast.parse(source)))
    module = importlib.import_module(function.__module__)
    for index in range(count):
        tree = ast.parse(source)
        node, how = list(_mutation_sites(tree))[index]
        _mutate(node, how)
        namespace = dict(vars(module))
        exec(compile(ast.fix_missing_locations(tree), f"<mutant {index}>", "exec"),
             namespace)
        yield f"{how} at line {node.lineno}", namespace[function.__name__]


def _rejected(exercise, mutant) -> bool:
    fn = mutant if exercise.adapt is None else exercise.adapt(mutant)
    try:
        return exercise.checker(fn).status != CORRECT
    except Exception:  # noqa: BLE001 - a mutant that crashes the checker is caught too
        return True


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_the_checker_rejects_most_mutants_of_its_reference(name):
    exercise = exercise_named(name)
    results = [(label, _rejected(exercise, mutant))
               for label, mutant in mutants(exercise.reference_function())]
    share = sum(rejected for _, rejected in results) / len(results)
    missed = [label for label, rejected in results if not rejected]
    print(f"\n{name}: {share:.0%} of {len(results)} mutants rejected; "
          f"accepted: {missed}")
    assert share >= FLOORS[name], (share, missed)
