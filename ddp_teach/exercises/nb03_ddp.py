"""Checker for notebook 03's bucket assignment (the gradient hook and the
finishing step: nb03_hook.py and nb03_finish.py).

What the reference, `dt.ddp.bucket_indices`, guarantees, each property
checked on the cases below, with the hint that names the mistake breaking it:
- a list of buckets, each a list of parameter indices, every index exactly
  once (none lost, none twice, no empty bucket);
- the order the gradients arrive: the last parameter first, across the
  buckets and inside each;
- a bucket takes the next parameter first, then closes once it holds AT
  LEAST its cap (it may go over; only the last bucket may hold less), and
  the count starts again from zero for the next one;
- the first bucket's cap is first_cap_bytes, every later one's cap_bytes;
  caps are in bytes, as the sizes are;
- cap None: one bucket; 0: one bucket per parameter; no parameters: none;
- the caller's `sizes_bytes` is left as it was.
This is torch's rule when it rebuilds its buckets (reducer.cpp,
`compute_bucket_assignment_by_size` with limits [first, cap]);
tests/course/test_ddp.py checks the reference against torch's function.
"""
import operator

from ddp_teach.ddp import MIB, bucket_indices
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

NOTEBOOK_MODEL = [MIB, 2048] * 6  # notebook 03's six Linear(512, 512): weight, bias
BUCKET_CASES = [([2, 2, 2, 2, 2, 2], 4, 2),  # exact fits: tells >= from >
                ([1, 1, 1, 1], 2, 2),  # the first bucket's exact fit
                ([4, 4, 4, 4], 8, 4), ([100, 200, 300, 400, 500], 450, 150),
                ([30, 1, 1, 1, 2, 9, 1], 5, 5),  # one larger than the cap
                ([3 * MIB, MIB, 2 * MIB, MIB // 2, MIB // 2], 25 * MIB, MIB),
                (NOTEBOOK_MODEL, 2 * MIB, 2 * MIB),  # torch's explicit cap
                (NOTEBOOK_MODEL, 25 * MIB, MIB),  # torch's default
                ([5, 5, 5], None, 4), ([5, 5, 5], 0, 0), ([], 8, 4), ([7], 8, 4)]


def walk(sizes, cap, first_cap, *, forward=False, strictly=False,
         first_everywhere=False, no_first=False, before_adding=False,
         keep_count=False, parameter_alone=False, drop_open=False):
    """The bucket rule, or (with a flag) a mistake a learner makes in it:
    walking from the first parameter, closing only above the cap, the first
    cap for every bucket or for none, closing before a parameter would go
    over, never resetting the count, comparing one parameter's size with
    the cap, forgetting the bucket still open at the end."""
    order = range(len(sizes)) if forward else reversed(range(len(sizes)))
    buckets, current, filled = [], [], 0
    for index in order:
        limit = cap if buckets and not first_everywhere or no_first else first_cap
        if before_adding and current and filled + sizes[index] > limit:
            buckets.append(current)
            current, filled = [], 0
            limit = first_cap if first_everywhere else cap
        current.append(index)
        filled = sizes[index] if parameter_alone else filled + sizes[index]
        if not before_adding and (filled > limit if strictly else filled >= limit):
            buckets.append(current)
            current = []
            filled = filled if keep_count else 0
    return buckets + ([current] if current and not drop_open else [])


MISTAKES = [  # (how the mistake walks, the hint that names it)
    (dict(forward=True), "fill buckets from the LAST parameter: backward "
     "produces its gradient first, so the first bucket is ready first."),
    (dict(no_first=True), "the first bucket's cap is first_cap_bytes, not "
     "cap_bytes: torch passes a smaller one (1 MiB) when bucket_cap_mb is "
     "left unset, so that the first all-reduce starts early."),
    (dict(first_everywhere=True), "first_cap_bytes is for the FIRST bucket "
     "only; once it has closed, every later bucket closes at cap_bytes."),
    (dict(strictly=True), "close a bucket once it holds AT LEAST its cap "
     "(>=), not only once it holds more than it."),
    (dict(before_adding=True), "a bucket may go over its cap: add the "
     "parameter first, then close the bucket if it holds at least its cap. "
     "Yours closes a bucket before a parameter would make it too big."),
    (dict(keep_count=True), "when a bucket closes, the next one starts "
     "empty: set its byte count back to 0."),
    (dict(parameter_alone=True), "compare the bytes the whole BUCKET holds "
     "with the cap, not the size of the parameter just added."),
    (dict(drop_open=True), "the parameters of the last bucket are missing: "
     "the bucket still open when the walk ends is the last one."),
    (dict(in_mib=True), "the caps are in bytes already, as the sizes are: "
     "do not multiply them by 1024 * 1024."),
    (dict(sizes_in_mib=True), "the caps and the sizes are both in bytes: "
     "compare them as they are, without dividing either by 1024 * 1024."),
    (dict(buckets_reversed=True), "the buckets are right but in reverse "
     "order: bucket 0 must be the first one ready, the one with the last "
     "parameter."),
    (dict(sorted_inside=True), "inside a bucket, keep the order the "
     "gradients arrive (the last parameter first), not the indices sorted."),
]


def mistaken(sizes, cap, first_cap, *, in_mib=False, sizes_in_mib=False,
             buckets_reversed=False, sorted_inside=False, **walk_flags):
    """What a mistake gives: a mistaken walk, caps taken as MiB, or the
    right buckets returned in another order."""
    if in_mib:
        cap, first_cap = cap * MIB, first_cap * MIB
    if sizes_in_mib:
        cap, first_cap = cap / MIB, first_cap / MIB
    buckets = walk(sizes, cap, first_cap, **walk_flags)
    if sorted_inside:
        buckets = [sorted(bucket) for bucket in buckets]
    return buckets[::-1] if buckets_reversed else buckets


def _as_buckets(got):
    """The learner's result as a list of lists of ints, or None if it is
    not one. Any integral type counts as an index (numpy's integers, a
    0-d integer tensor), as `operator.index` accepts it; bool does not."""
    try:
        return [[operator.index(i) for i in _refuse_bool(bucket)] for bucket in got]
    except TypeError:
        return None


def _refuse_bool(bucket):
    """The bucket's items; a bool (True is operator.index'ed to 1) is no index."""
    items = list(bucket)
    if any(isinstance(i, bool) for i in items):
        raise TypeError("a bool is not a parameter index")
    return items


def _hint(case, got, seen) -> str:
    """The hint for `got`, the wrong result on `case`; `seen` is every
    (case, result) the function gave, so that a mistake is named only if
    it explains all of them."""
    sizes, cap, first_cap = case
    if cap is None:
        return "cap None means one bucket with every parameter, the last one first."
    if not sizes:
        return "no parameters, no buckets: return an empty list."
    if cap == 0:
        return "cap 0 means one bucket per parameter, the last parameter first."
    for flags, hint in MISTAKES:
        if all(result == mistaken(*other, **flags) for other, result in seen
               if other[0] and other[1]):
            return hint
    flat = [index for bucket in got for index in bucket]
    if any(not bucket for bucket in got):
        return "an empty bucket: only close a bucket that holds a parameter."
    if sorted(flat) != list(range(len(sizes))):
        return ("every parameter index must be in exactly one bucket: "
                f"missing {sorted(set(range(len(sizes))) - set(flat))}, "
                f"twice {sorted({i for i in flat if flat.count(i) > 1})}.")
    return ("a bucket takes each parameter in turn, from the last, and "
            "closes once it holds at least its cap (first_cap_bytes for the "
            "first bucket, cap_bytes after): compare yours with the expected "
            "buckets above to see where one closed too early or too late.")


def check_bucket_assignment(fn) -> Verdict:
    seen, wrong = [], None
    for sizes, cap, first_cap in BUCKET_CASES:
        given = list(sizes)
        try:
            result = fn(given, cap, first_cap)
        except NotImplementedError:
            return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
        want = bucket_indices(sizes, cap, first_cap)
        shown = f"sizes {sizes}, cap {cap}, first cap {first_cap}: "
        if given != list(sizes):
            return Verdict(WRONG, shown + f"your function changed sizes_bytes to "
                           f"{given}.\nHint: leave the caller's list as it was "
                           "(no reverse(), sort() or pop() on it): walk the "
                           "indices backwards instead.")
        got = _as_buckets(result)
        if got is None:
            return Verdict(WRONG, shown + f"expected {want}, got {result!r}."
                           "\nHint: return a list of buckets, each a list of "
                           "parameter indices" + (" (the function returned "
                           "None: is `return` missing?)" if result is None
                           else "."))
        seen.append(((sizes, cap, first_cap), got))
        if got != want and wrong is None:
            wrong = (sizes, cap, first_cap), got, shown + f"expected {want}, got {got}."
    if wrong is None:
        return Verdict(CORRECT, f"{len(BUCKET_CASES)} cases: exact fits, a "
                                "parameter larger than the cap, dt.ddp's and "
                                "torch's caps, None and 0, and no parameters.")
    case, got, shown = wrong
    return Verdict(WRONG, shown + "\nHint: " + _hint(case, got, seen))


register(Exercise(
    "ddp_bucket_assignment", "Bucket assignment", "my_bucket_indices",
    "ddp_teach.ddp:bucket_indices", check_bucket_assignment,
    ["Walk the parameter indices from the last to the first: that is the "
     "order backward produces the gradients.",
     "Add each to the open bucket and its size to the bucket's bytes; once "
     "the bytes reach the cap (first_cap_bytes for the first bucket, "
     "cap_bytes after), close the bucket and start an empty one.",
     "A bucket still open at the end is the last one; cap None: one bucket; "
     "cap 0: one per parameter."],
    stub_parameters=("sizes_bytes", "cap_bytes", "first_cap_bytes")))
