"""Notebook 06's planted mistakes for clipping a sharded gradient (PLANTED,
run by test_registry.py, which also checks every reference and stub): each
must get the hint that fits. The last four are the second attempt's
mistakes: the sum of squares returned as the norm, the largest shard's
norm, a division by a zero norm, and a rank with an empty shard that
skips the all-reduce."""
import torch
import torch.distributed as dist


def _total_norm(shard_grad):
    total = shard_grad.square().sum()
    dist.all_reduce(total)
    return total.sqrt()


def local_norm(shard_grad, max_norm):
    norm = shard_grad.norm()  # this rank's shard only
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def norms_added(shard_grad, max_norm):
    norm = shard_grad.norm()
    dist.all_reduce(norm)  # norms do not add
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def squares_averaged(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    norm = total.sqrt()
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def scales_up_too(shard_grad, max_norm):
    norm = _total_norm(shard_grad)
    shard_grad.mul_(max_norm / (norm + 1e-6))  # no clamp: small gradients grow
    return norm


def not_in_place(shard_grad, max_norm):
    norm = _total_norm(shard_grad)
    shard_grad = shard_grad * (max_norm / (norm + 1e-6)).clamp(max=1.0)  # a copy
    return norm


# ---- the second attempt ---------------------------------------------------------

def no_square_root(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total)  # the sum of squares, taken for the norm
    shard_grad.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


def largest_norm(shard_grad, max_norm):
    norm = shard_grad.norm()
    dist.all_reduce(norm, op=dist.ReduceOp.MAX)
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def divides_by_the_norm(shard_grad, max_norm):
    norm = _total_norm(shard_grad)
    shard_grad.mul_(min(1.0, max_norm / norm.item()))  # 0 for a zero gradient
    return norm


def skips_an_empty_shard(shard_grad, max_norm):
    if shard_grad.numel() == 0:
        return torch.tensor(0.0)  # "nothing to clip here": no all-reduce
    norm = _total_norm(shard_grad)
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


# tried as a learner would (issue 34)

def gathers_every_shard(shard_grad, max_norm):
    """The right norm, by gathering every shard to every rank: the memory
    and traffic sharding exists to save."""
    sizes = [torch.zeros((), dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor(shard_grad.numel()))
    width = int(max(sizes))
    padded = torch.zeros(width)
    padded[:shard_grad.numel()] = shard_grad
    pieces = [torch.empty(width) for _ in sizes]
    dist.all_gather(pieces, padded)
    norm = torch.cat(pieces).norm()
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def gathers_the_sums_of_squares(shard_grad, max_norm):
    """Right, in another style: one float64 number per rank, gathered."""
    mine = shard_grad.double().square().sum()
    every = [torch.zeros((), dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    norm = torch.stack(every).sum().sqrt()
    shard_grad.mul_(min(1.0, max_norm / (float(norm) + 1e-6)))
    return float(norm)


def norm_of_a_vector_of_norms(shard_grad, max_norm):
    """Right, in another style: torch.linalg.vector_norm, the squares
    all-reduced as a one-element float32 tensor."""
    total = torch.linalg.vector_norm(shard_grad).pow(2).reshape(1)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    norm = total.sqrt()[0]
    shard_grad *= torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return norm


def unwaited_all_reduce(shard_grad, max_norm):
    total = shard_grad.square().sum()
    dist.all_reduce(total, async_op=True)
    norm = total.sqrt()
    shard_grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def test_clipping_in_other_styles_passes(verdict):
    for right in (gathers_the_sums_of_squares, norm_of_a_vector_of_norms):
        passed, seen = verdict("sharded_clip", right)
        assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("sharded_clip", local_norm, "this rank's shard's norm"),
    ("sharded_clip", norms_added, "norms do not add"),
    ("sharded_clip", squares_averaged, "were averaged"),
    ("sharded_clip", scales_up_too, "never above 1"),
    ("sharded_clip", not_in_place, "not changed"),
    ("sharded_clip", no_square_root, "is its square root"),
    ("sharded_clip", largest_norm, "the largest shard's norm"),
    ("sharded_clip", divides_by_the_norm, ("ZeroDivisionError", "the 1e-6 keeps it finite")),
    ("sharded_clip", skips_an_empty_shard, ("rank 2", "must still join the all-reduce")),
    ("sharded_clip", gathers_every_shard, ("bytes to collectives",
                                           "gathering the shards")),
    ("sharded_clip", unwaited_all_reduce, ("never waited for", "work.wait()")),
]
