"""Notebook 03's bucket assignment: planted mistakes (PLANTED, run by
test_registry.py, which also checks the reference and the stub), each of
which must get the hint that names it. The first group breaks one property
each of those the checker's docstring lists; the second group are mistakes
found by trying the exercise again, after the checker was written."""
from ddp_teach.ddp import MIB, bucket_indices
from ddp_teach.exercises.nb03_ddp import walk


def forward_order(sizes, cap, first_cap):
    """Buckets filled from the FIRST parameter: the classic mistake."""
    n = len(sizes)
    return [[n - 1 - i for i in b] for b in bucket_indices(sizes[::-1], cap, first_cap)]


def no_small_first_bucket(sizes, cap, first_cap):
    return bucket_indices(sizes, cap, cap)


def closes_only_above_the_cap(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return walk(sizes, cap, first_cap, strictly=True)


def drops_the_open_bucket(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return walk(sizes, cap, first_cap, drop_open=True)


def caps_taken_as_mib(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return bucket_indices(sizes, cap * MIB, first_cap * MIB)


def reverses_the_callers_list(sizes, cap, first_cap):
    sizes.reverse()  # then walks "forward" over the reversed list
    buckets = bucket_indices(sizes[::-1], cap, first_cap)
    return buckets


def forgets_to_return(sizes, cap, first_cap):
    bucket_indices(sizes, cap, first_cap)


# second attempt: mistakes of our own, not in the list above

def first_cap_for_every_bucket(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return bucket_indices(sizes, first_cap, first_cap)


def never_goes_over_the_cap(sizes, cap, first_cap):
    """Bin-packing habit: close the bucket before a parameter would make it
    exceed its cap."""
    if cap is None:
        return bucket_indices(sizes, cap)
    return walk(sizes, cap, first_cap, before_adding=True)


def never_resets_the_count(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return walk(sizes, cap, first_cap, keep_count=True)


def compares_one_parameter_with_the_cap(sizes, cap, first_cap):
    if cap is None:
        return bucket_indices(sizes, cap)
    return walk(sizes, cap, first_cap, parameter_alone=True)


def buckets_returned_last_first(sizes, cap, first_cap):
    return bucket_indices(sizes, cap, first_cap)[::-1]


def sorts_each_bucket(sizes, cap, first_cap):
    return [sorted(b) for b in bucket_indices(sizes, cap, first_cap)]


def one_empty_bucket_for_no_parameters(sizes, cap, first_cap):
    return bucket_indices(sizes, cap, first_cap) or [[]]


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ddp_bucket_assignment", forward_order, "fill buckets from the LAST"),
    ("ddp_bucket_assignment", no_small_first_bucket, "first bucket's cap is first_cap_bytes"),
    ("ddp_bucket_assignment", closes_only_above_the_cap, "AT LEAST its cap"),
    ("ddp_bucket_assignment", drops_the_open_bucket, "the bucket still open"),
    ("ddp_bucket_assignment", caps_taken_as_mib, "in bytes already"),
    ("ddp_bucket_assignment", reverses_the_callers_list, "changed sizes_bytes"),
    ("ddp_bucket_assignment", forgets_to_return, "is `return` missing?"),
    ("ddp_bucket_assignment", first_cap_for_every_bucket, "for the FIRST bucket only"),
    ("ddp_bucket_assignment", never_goes_over_the_cap, "a bucket may go over its cap"),
    ("ddp_bucket_assignment", never_resets_the_count, "set its byte count back to 0"),
    ("ddp_bucket_assignment", compares_one_parameter_with_the_cap, "the whole BUCKET"),
    ("ddp_bucket_assignment", buckets_returned_last_first, "right but in reverse order"),
    ("ddp_bucket_assignment", sorts_each_bucket, "not the indices sorted"),
    ("ddp_bucket_assignment", one_empty_bucket_for_no_parameters, "no parameters, no buckets"),
]


def numpy_indices(sizes, cap, first_cap):
    """Right, with each index a numpy integer (np.arange walking backwards)."""
    import numpy as np
    return [[np.int64(i) for i in bucket]
            for bucket in bucket_indices(sizes, cap, first_cap)]


def tensor_buckets(sizes, cap, first_cap):
    """Right, each bucket a tensor of indices."""
    import torch
    return [torch.tensor(bucket, dtype=torch.long)
            for bucket in bucket_indices(sizes, cap, first_cap)]


def test_indices_of_any_integral_type_are_accepted(verdict):
    for right in (numpy_indices, tensor_buckets):
        passed, seen = verdict("ddp_bucket_assignment", right)
        assert passed, seen


def test_bools_and_floats_are_not_indices(verdict):
    passed, seen = verdict("ddp_bucket_assignment", lambda s, c, f: [
        [float(i) for i in b] for b in bucket_indices(s, c, f)])
    assert not passed and "each a list of parameter indices" in seen, seen
