"""`make test-mutants`: one-edit mutants of the rank-based references, each
run through its exercise's checker, and the share each checker rejects.

The checkers that start worker ranks cost a few seconds a mutant, too much
for `make test`; tests/exercises/test_mutants.py does the in-kernel ones.
This prints a markdown table (exercise, mutants, rejected, share, time)
and, with --accepted, the mutants each checker called correct (equivalent
to the reference, or a mistake it misses: read them).

    python tools/exercise_mutants.py                 # every rank-based exercise
    python tools/exercise_mutants.py ring_allreduce  # some of them
    python tools/exercise_mutants.py --time          # the reference only, timed
"""
import argparse
import sys
import time

from ddp_teach.exercises import exercise_named
from ddp_teach.exercises.mutants import mutants, rejected
from ddp_teach.exercises.registry import CORRECT

# The exercises whose checker runs the learner's function on worker ranks.
RANK_BASED = ("fix_hang", "ring_allreduce", "all_gather_p2p", "ddp_finish",
              "ddp_grad_hook", "no_sync_accumulation", "syncbn_stats",
              "compression_hook", "sharded_clip", "zero1_step",
              "zero3_gather_forward", "checkpoint_save", "torchrun_script",
              "param_server_update", "column_parallel_linear", "dataset_mean",
              "differing_tensors", "nonfinite_ranks", "ring_attention")


def time_reference(name: str) -> str:
    """The checker's verdict on the reference, and how long it took."""
    exercise = exercise_named(name)
    start = time.perf_counter()
    verdict = exercise.checker(exercise.reference_solution())
    seconds = time.perf_counter() - start
    return f"| {name} | {verdict.status} | {seconds:.1f} s |"


def measure(name: str, show_accepted: bool) -> str:
    """One table row: how many one-edit mutants the checker rejects."""
    exercise = exercise_named(name)
    start = time.perf_counter()
    results = [(label, rejected(exercise, mutant))
               for label, mutant in mutants(exercise.reference_function())]
    seconds = time.perf_counter() - start
    caught = sum(was for _, was in results)
    share = caught / len(results) if results else float("nan")
    row = (f"| {name} | {len(results)} | {caught} | {share:.0%} | "
           f"{seconds:.0f} s |")
    if show_accepted:
        accepted = [label for label, was in results if not was]
        row += f"\n    accepted: {', '.join(accepted) or 'none'}"
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="exercises (default: every "
                        "rank-based one)")
    parser.add_argument("--time", action="store_true",
                        help="only time the checker on the reference")
    parser.add_argument("--accepted", action="store_true",
                        help="list the mutants each checker accepted")
    args = parser.parse_args(argv)
    names = args.names or RANK_BASED
    if args.time:
        exercise_named(names[0]).checker(exercise_named(names[0])
                                         .reference_solution())  # start the fork server
        print("| exercise | verdict on the reference | time |\n|---|---|---|")
        for name in names:
            print(time_reference(name), flush=True)
        return 0
    print("| exercise | mutants | rejected | share | time |\n|---|---|---|---|---|")
    for name in names:
        print(measure(name, args.accepted), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
