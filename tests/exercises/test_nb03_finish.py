"""Notebook 03's finishing step: planted mistakes (PLANTED, run by
test_registry.py, which also checks the reference and the stub), each of
which must get the hint that names it. The first group breaks one property
each of those the checker's docstring lists; the second group are mistakes
found by trying the exercise again, after the checker was written."""
from ddp_teach.ddp import finish_buckets


def no_wait(buckets, world_size):
    for bucket in buckets:
        bucket["buffer"].div_(world_size)


def no_division(buckets, world_size):
    finish_buckets(buckets, 1)


def copies_before_waiting(buckets, world_size):
    """Right only when the sum happens to land before the copy."""
    for bucket in buckets:
        offset = 0
        for param in bucket["params"]:
            piece = bucket["buffer"][offset:offset + param.numel()]
            param.grad.copy_(piece.view_as(param) / world_size)
            offset += param.numel()
        bucket["work"].wait()


def offset_not_advanced(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)
        for param in bucket["params"]:
            param.grad.copy_(bucket["buffer"][:param.numel()].view_as(param))


def never_copies_back(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)


# second attempt: mistakes of our own, not in the list above

def divides_before_waiting(buckets, world_size):
    for bucket in buckets:
        bucket["buffer"].div_(world_size)
        bucket["work"].wait()
        offset = 0
        for param in bucket["params"]:
            param.grad.copy_(bucket["buffer"][offset:offset + param.numel()].view_as(param))
            offset += param.numel()


def divides_twice(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)
        offset = 0
        for param in bucket["params"]:
            piece = bucket["buffer"][offset:offset + param.numel()]
            param.grad.copy_(piece.view_as(param) / world_size)
            offset += param.numel()


def returns_inside_the_loop(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)
        offset = 0
        for param in bucket["params"]:
            param.grad.copy_(bucket["buffer"][offset:offset + param.numel()].view_as(param))
            offset += param.numel()
        for other in buckets[1:]:
            other["work"].wait()  # every work waited, only the first copied
        return


def walks_the_params_in_reverse(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        bucket["buffer"].div_(world_size)
        offset = 0
        for param in reversed(bucket["params"]):
            param.grad.copy_(bucket["buffer"][offset:offset + param.numel()].view_as(param))
            offset += param.numel()


def divides_by_the_number_of_buckets(buckets, world_size):
    finish_buckets(buckets, len(buckets))


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ddp_finish", no_wait, "never waited"),
    ("ddp_finish", no_division, "divide the buffer by world_size"),
    ("ddp_finish", offset_not_advanced, "running offset"),
    ("ddp_finish", copies_before_waiting, "before the bucket's work.wait() returned"),
    ("ddp_finish", never_copies_back, "still holds this rank's own gradient"),
    ("ddp_finish", divides_before_waiting, "changed (divided?) before its work.wait()"),
    ("ddp_finish", divides_twice, "divided by world_size twice"),
    ("ddp_finish", returns_inside_the_loop, "finish EVERY bucket"),
    ("ddp_finish", walks_the_params_in_reverse, "went to the parameters in reverse"),
    ("ddp_finish", divides_by_the_number_of_buckets, "the average times 0.5"),
]


def waits_on_the_future(buckets, world_size):
    """Right, waiting through the work's future, as torch's Work allows."""
    for bucket in buckets:
        summed = bucket["work"].get_future().wait()[0]
        summed /= world_size
        offset = 0
        for p in bucket["params"]:
            p.grad.copy_(summed[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def polls_then_splits(buckets, world_size):
    """Right, polling is_completed() and splitting the buffer by sizes."""
    for bucket in buckets:
        while not bucket["work"].is_completed():
            pass
        pieces = (bucket["buffer"] / world_size).split(
            [p.numel() for p in bucket["params"]])
        for p, piece in zip(bucket["params"], pieces):
            p.grad = piece.view_as(p).clone()


def test_a_work_waited_through_its_future_or_polled_is_right(verdict):
    for right in (waits_on_the_future, polls_then_splits):
        passed, seen = verdict("ddp_finish", right)
        assert passed, seen
