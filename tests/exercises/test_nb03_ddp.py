"""Notebook 03's planted mistakes (PLANTED, run by test_registry.py, which
also checks every reference and stub): each must get the hint that fits."""
import torch.distributed as dist

from ddp_teach.ddp import bucket_indices, finish_buckets
from ddp_teach.exercises.nb03_ddp import closing_strictly


def forward_order(sizes, cap, first_cap):
    """Buckets filled from the FIRST parameter: the classic mistake."""
    n = len(sizes)
    return [[n - 1 - i for i in b] for b in bucket_indices(sizes[::-1], cap, first_cap)]


def blocking_hook(pending):
    def hook(param):
        pending.append((param, dist.all_reduce(param.grad)))
    return hook


def forgetful_hook(pending):
    def hook(param):
        dist.all_reduce(param.grad, async_op=True).wait()
    return hook


def waits_inside_the_hook(pending):
    """Async in name only: the wait() stops backward until the sum arrives."""
    def hook(param):
        work = dist.all_reduce(param.grad, async_op=True)
        work.wait()
        pending.append((param, work))
    return hook


def reduces_the_parameter(pending):
    def hook(param):
        pending.append((param, dist.all_reduce(param.data, async_op=True)))
    return hook


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


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ddp_bucket_assignment", forward_order, "fill buckets from the LAST"),
    ("ddp_bucket_assignment", lambda s, c, f: bucket_indices(s, c, c) if c
     else bucket_indices(s, c, f), "the first bucket is capped"),
    ("ddp_bucket_assignment", closing_strictly, "AT LEAST its cap"),
    ("ddp_grad_hook", blocking_hook, "async_op=True"),
    ("ddp_grad_hook", forgetful_hook, "append (param, work)"),
    ("ddp_grad_hook", reduces_the_parameter, "not the parameter itself"),
    ("ddp_grad_hook", waits_inside_the_hook, "before backward went on"),
    ("ddp_finish", no_wait, "never waited"),
    ("ddp_finish", no_division, "divide the buffer by world_size"),
    ("ddp_finish", offset_not_advanced, "running offset"),
    ("ddp_finish", copies_before_waiting, "before the bucket's work.wait() returned"),
]

