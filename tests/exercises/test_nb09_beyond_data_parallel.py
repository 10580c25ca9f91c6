"""Notebook 10's planted mistakes for the parameter server's update rule
(PLANTED, run by test_registry.py, which also checks every reference and
stub): each must get the hint that fits. The last three are the second
attempt's mistakes: the accumulator rebound instead of added to, a step
one push late, and an update written by hand instead of the server's
optimizer."""
import torch

from ddp_teach.paramserver import sync_update


def _accumulate(server, grads):
    for total, grad in zip(server.pending, grads):
        total += grad
    server.pushes += 1


def _step(server, scale):
    for param, total in zip(server.params, server.pending):
        param.grad = total * scale
    server.optimizer.step()


def steps_every_push(server, grads):
    for param, grad in zip(server.params, grads):
        param.grad = grad
    server.optimizer.step()
    return True


def sums(server, grads):
    _accumulate(server, grads)
    if server.pushes < server.num_workers:
        return False
    _step(server, 1.0)
    for total in server.pending:
        total.zero_()
    server.pushes = 0
    return True


def keeps_accumulator(server, grads):
    _accumulate(server, grads)
    if server.pushes < server.num_workers:
        return False
    _step(server, 1 / server.num_workers)
    server.pushes = 0
    return True


def keeps_count(server, grads):
    _accumulate(server, grads)
    if server.pushes != server.num_workers:
        return False
    _step(server, 1 / server.num_workers)
    for total in server.pending:
        total.zero_()
    return True


def returns_nothing(server, grads):
    sync_update(server, grads)


# ---- the second attempt ---------------------------------------------------------

def rebinds_the_accumulator(server, grads):
    for total, grad in zip(server.pending, grads):
        total = total + grad  # a new tensor under the loop's name  # noqa: F841
    server.pushes += 1
    if server.pushes < server.num_workers:
        return False
    _step(server, 1 / server.num_workers)
    server.pushes = 0
    return True


def steps_one_push_late(server, grads):
    _accumulate(server, grads)
    if server.pushes <= server.num_workers:  # waits for one push too many
        return False
    _step(server, 1 / server.num_workers)
    for total in server.pending:
        total.zero_()
    server.pushes = 0
    return True


def updates_by_hand(server, grads):
    _accumulate(server, grads)
    if server.pushes < server.num_workers:
        return False
    lr = server.optimizer.param_groups[0]["lr"]
    with torch.no_grad():  # plain SGD, whatever the server's optimizer is
        for param, total in zip(server.params, server.pending):
            param -= lr * total / server.num_workers
            total.zero_()
    server.pushes = 0
    return True


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("param_server_update", steps_every_push, "waits until EVERY worker"),
    ("param_server_update", sums, "SUM of the workers' gradients"),
    ("param_server_update", keeps_accumulator, "zero server.pending"),
    ("param_server_update", keeps_count, "server.pushes back to 0"),
    ("param_server_update", returns_nothing, "returned None, not True"),
    ("param_server_update", rebinds_the_accumulator, "only rebinds a loop variable"),
    ("param_server_update", steps_one_push_late, "one push too many"),
    ("param_server_update", updates_by_hand, "without the momentum"),
]
