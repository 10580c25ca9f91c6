"""A wrong answer's verdict names the smallest case it fails on (world
size, micro-batches, the losses) and, where the answer is tensors, the
first element that differs with its expected and received values: the
checkers try cases small to large and stop at the first failure."""
import math

import numpy as np

import torch
import torch.distributed as dist

from ddp_teach.exercises import exercise_named
from ddp_teach.exercises.registry import WRONG


def verdict(name, fn):
    found = exercise_named(name).checker(fn)
    assert found.status == WRONG, found.message
    return found.message


def finish_without_dividing(buckets, world_size):
    for bucket in buckets:
        bucket["work"].wait()
        offset = 0
        for p in bucket["params"]:
            p.grad.copy_(bucket["buffer"][offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def test_a_sum_left_undivided_is_shown_on_two_ranks_with_the_first_element():
    message = verdict("ddp_finish", finish_without_dividing)
    # on 1 rank the sum is the average: 2 ranks is the smallest failing case
    assert message.startswith("on 2 ranks"), message
    assert "0.weight (shape (8, 6)) at [0, 0]: expected" in message, message
    assert "got" in message and "SUM over ranks" in message, message


def make_max_hook(pending):
    def hook(param):
        pending.append((param, dist.all_reduce(param.grad, op=dist.ReduceOp.MAX,
                                               async_op=True)))
    return hook


def test_a_hook_reducing_with_max_is_shown_with_the_expected_sum():
    message = verdict("ddp_grad_hook", make_max_hook)
    assert message.startswith("on 2 ranks, rank 0:"), message
    assert "not the sum over the ranks: 0.weight" in message, message


def accumulate_over_three(model, micro_batches):
    """Divides by 3 whatever the number of micro-batches."""
    for i, x in enumerate(micro_batches):
        loss = model(x).square().mean() / 3
        if i < len(micro_batches) - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()


def test_a_count_typed_in_is_shown_on_one_micro_batch_and_one_rank():
    message = verdict("no_sync_accumulation", accumulate_over_three)
    assert message.startswith("with 1 micro-batch on 1 rank:"), message
    assert "expected" in message and "got" in message, message


def nan_only(loss):
    flag = torch.tensor([float(math.isnan(loss.item()))])
    flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, flag)
    return [r for r, f in enumerate(flags) if f.item()]


def test_a_nan_only_test_is_shown_on_two_ranks_with_their_losses():
    message = verdict("nonfinite_ranks", nan_only)
    assert "on 2 ranks, losses [inf, -inf] on ranks 0, 1: expected [0, 1]" in message, message
    assert "an inf is not a NaN" in message, message


def zero1_times_world_size(flat_params, flat_grads, shard, optimizer):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    size = flat_params.numel() // world_size
    shard.grad = flat_grads[rank * size:(rank + 1) * size].clone() * world_size
    optimizer.step()
    with torch.no_grad():
        dist.all_gather_single(flat_params, shard.detach())


def test_a_gradient_scaled_by_the_world_size_is_shown_on_two_ranks():
    message = verdict("zero1_step", zero1_times_world_size)
    # AdamW does not see a scale; SGD does, from 2 ranks on
    assert message.startswith("SGD with momentum, 2 ranks, rank 0, after 4 steps: "
                              "flat_params (shape (60,)) at [0]: expected"), message


def step_time_without_compute(compute_s, nbytes, world_size, link):
    steps = 2 * (world_size - 1)
    return steps * (link.alpha + nbytes / world_size * link.beta)


def test_a_step_time_that_forgets_the_compute_is_shown_on_one_gpu():
    message = verdict("step_time", step_time_without_compute)
    assert message.startswith("the smallest case that fails, of 90: compute_s=0.001, "
                              "nbytes=467336, world_size=1"), message
    assert "expected 0.001 s, got 0.0" in message, message


def line_fit(sizes, times, p):
    slope, intercept = np.polyfit(sizes, times, 1)
    return intercept, slope


def test_a_fit_of_the_wrong_model_is_shown_on_two_measurements():
    message = verdict("fit_alpha_beta", line_fit)
    assert "(n = [1000, 1e+07] bytes, t = [4.1e-05, 0.01004] s)" in message, message
    assert "expected alpha=2e-05, beta=1e-09" in message, message


def data_parallel_scaled_pieces(module, inputs, devices):
    """Every piece but the first doubled: right on one device only."""
    from ddp_teach import dp
    pieces = dp.scatter(inputs, devices)
    outs = [module(p * (1 + (i > 0))) for i, p in enumerate(pieces)]
    return dp.gather(outs, devices[0])


def test_a_data_parallel_wrong_on_the_second_piece_is_shown_on_two_rows():
    message = verdict("data_parallel", data_parallel_scaled_pieces)
    assert message.startswith("a batch of 2 rows on 2 devices: the output differs"), message
    assert "output (shape (2, 1)) at [1, 0]: expected" in message, message


def ring_dropping_the_last_element(tensor):
    from ddp_teach.collectives import ring_allreduce
    ring_allreduce(tensor)
    if tensor.numel() > 1 and tensor.is_contiguous():
        tensor.view(-1)[-1] = 0


def test_a_ring_wrong_on_two_elements_is_shown_on_the_smallest_tensor():
    message = verdict("ring_allreduce", ring_dropping_the_last_element)
    assert message.startswith("on 1 rank, rank 0, a tensor of 2 float32 values "
                              "(the smallest case that fails)"), message
    assert "expected           [1, 4]" in message and "got                [1, 0]" in message, message
