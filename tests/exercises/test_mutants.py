"""Mutants of the references, for the checkers that run in the kernel (no
ranks to start, so every mutant is cheap): each small edit a learner might
make by accident (an integer off by one, a comparison made strict or loose,
== turned into !=, + into -, * into /, and, or swapped, a call's first two
arguments swapped, a .wait() dropped, a loop run in reversed order) is applied to the reference's own source, one at a
time, and checked. A mutant the checker calls correct is either equivalent
to the reference or a mistake it misses; the share rejected is printed
(pytest -s) and held above a floor measured when this test was written, so
that a checker that gets weaker fails here.

The checkers that run on ranks are left out: a mutant costs them a few
seconds of worker processes each, too much for the test suite; `make
test-mutants` (tools/exercise_mutants.py) measures them.
"""
import pytest

from ddp_teach.exercises import exercise_named
from ddp_teach.exercises.mutants import mutants, rejected

# exercise: the share of mutants its checker must reject. Measured when
# written: 100% for the sampler, scatter and the loss scale; 83% for
# gather (the three left reverse loops whose order does not matter: the
# key check, a dict's keys, the length check); 80% for the buckets (the
# one left, min(a, b) as min(b, a), is equivalent); 66% for the fit (the
# rest are in its input checks and its non-negative branch, which the
# exercise does not ask for, and two reversed loops over its candidates);
# 41% for the diagnosis (the rest are equivalent: > made >= on continuous
# times, world_size > 1 made > 0 where every case has 2 ranks or more,
# rank 0's row made rank 1's, loops whose order does not matter)
FLOORS = {"sampler_split": 0.8, "ddp_bucket_assignment": 0.7,
          "loss_scale_update": 0.8, "dp_scatter": 0.6, "dp_gather": 0.6,
          "fit_alpha_beta": 0.6, "diagnose": 0.4}


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_the_checker_rejects_most_mutants_of_its_reference(name):
    exercise = exercise_named(name)
    results = [(label, rejected(exercise, mutant))
               for label, mutant in mutants(exercise.reference_function())]
    share = sum(was for _, was in results) / len(results)
    missed = [label for label, was in results if not was]
    print(f"\n{name}: {share:.0%} of {len(results)} mutants rejected; "
          f"accepted: {missed}")
    assert share >= FLOORS[name], (share, missed)
