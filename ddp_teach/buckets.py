"""DDP's bucket rule: which gradients travel together, and the cap's check.

Why a module of its own: two layers need the same rule. The course's
`ddp_teach.ddp.DistributedDataParallel` builds its buckets with it, and the
simulator's schedule `ddp_teach.sim.schedules.predict.bucketed_ddp` charges one
all-reduce per bucket with it. If the simulator imported the lesson's
module, changing the lesson could change what the simulator predicts for
it; so the rule sits here, beside both, and imports neither (only the
standard library). `ddp_teach.ddp` re-exports these names: notebooks and
checkers use `dt.ddp.bucket_indices`, `dt.ddp.MIB`.

The rule is torch 2.13's (torch/nn/parallel/distributed.py,
`_BucketCapacityConfig`; the assignment itself is the C++ reducer's,
exposed as `dist._compute_bucket_assignment_by_size`): buckets filled from
the last parameter, the first capped at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`)
when the cap is left at its default. Where ours and torch's differ is in
ddp_teach.ddp's docstring.
"""
import numbers

MIB = 1024 * 1024
FIRST_BUCKET_CAP_MB = 1.0


def bucket_indices(sizes_bytes, cap_bytes, first_cap_bytes=FIRST_BUCKET_CAP_MB * MIB):
    """Group parameters into buckets: lists of parameter indices, the last
    parameter first. Walking from the last parameter, each is added to the
    open bucket, which closes once it holds at least its cap: the first
    bucket's cap is first_cap_bytes (but never more than cap_bytes), the
    others' cap_bytes. cap None: one bucket; 0: one per parameter.

    With first_cap_bytes <= cap_bytes this is what torch's reducer computes
    when it rebuilds its buckets (`dist._compute_bucket_assignment_by_size`
    with limits [first, cap], in the order the gradients became ready),
    here with the reverse of `parameters()` as that order."""
    if cap_bytes is None:
        return [list(reversed(range(len(sizes_bytes))))] if sizes_bytes else []
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes_bytes))):
        current.append(index)
        filled += sizes_bytes[index]
        cap = min(cap_bytes, first_cap_bytes) if not buckets else cap_bytes
        if filled >= cap:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


def check_bucket_cap(bucket_cap_mb, name: str = "bucket_cap_mb") -> None:
    """A ValueError unless `bucket_cap_mb` is None or a number >= 0. Checked
    before any communication, so every rank refuses at once, none hangs."""
    if bucket_cap_mb is None and name == "bucket_cap_mb":
        return
    if (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real)
            or not bucket_cap_mb >= 0):
        what = ("a number >= 0 or None" if name == "bucket_cap_mb"
                else "a number >= 0")
        raise ValueError(
            f"{name} must be {what}, got {bucket_cap_mb!r}: it is the size of "
            f"a gradient bucket in MiB (torch's default is 25, with a first "
            f"bucket of 1; 0 gives one bucket per parameter, a bucket_cap_mb "
            f"of None one bucket for all)")
