"""Notebook 03's gradient hook: planted mistakes (PLANTED, run by
test_registry.py, which also checks the reference and the stub), each of
which must get the hint that names it. The first group breaks one property
each of those the checker's docstring lists; the second group are mistakes
found by trying the exercise again, after the checker was written."""
import torch
import torch.distributed as dist


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


def divides_before_the_sum(pending):
    def hook(param):
        param.grad /= dist.get_world_size()
        pending.append((param, dist.all_reduce(param.grad, async_op=True)))
    return hook


def averages_with_reduce_op_avg(pending):
    def hook(param):
        work = dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, async_op=True)
        pending.append((param, work))
    return hook


def appends_only_the_work(pending):
    def hook(param):
        pending.append(dist.all_reduce(param.grad, async_op=True))
    return hook


def waits_on_the_future(pending):
    def hook(param):
        work = dist.all_reduce(param.grad, async_op=True)
        work.get_future().wait()
        pending.append((param, work))
    return hook


def reduces_a_copy(pending):
    def hook(param):
        pending.append((param, dist.all_reduce(param.grad.clone(), async_op=True)))
    return hook


# second attempt: mistakes of our own, not in the list above

def returns_the_work(pending):
    def hook(param):
        work = dist.all_reduce(param.grad, async_op=True)
        pending.append((param, work))
        return work
    return hook


def divides_while_in_flight(pending):
    def hook(param):
        work = dist.all_reduce(param.grad, async_op=True)
        param.grad /= dist.get_world_size()
        pending.append((param, work))
    return hook


def forgets_to_return_the_hook(pending):
    def hook(param):
        pending.append((param, dist.all_reduce(param.grad, async_op=True)))


def appends_work_then_param(pending):
    def hook(param):
        pending.append((dist.all_reduce(param.grad, async_op=True), param))
    return hook


def waits_with_wait_all(pending):
    def hook(param):
        work = dist.all_reduce(param.grad, async_op=True)
        torch.futures.wait_all([work.get_future()])
        pending.append((param, work))
    return hook


def weights_only(pending):
    def hook(param):
        if param.dim() > 1:
            pending.append((param, dist.all_reduce(param.grad, async_op=True)))
    return hook


# tried as a learner would (issue 34)

def once_per_parameter_ever(pending):
    """Guards against a double call with a set that is never emptied: the
    next backward starts nothing."""
    done = set()

    def hook(param):
        if id(param) in done:
            return
        done.add(id(param))
        pending.append((param, dist.all_reduce(param.grad, async_op=True)))
    return hook


class _HookObject:
    """Right, in another style: a callable object holding the list."""

    def __init__(self, pending):
        self.pending = pending

    def __call__(self, param):
        work = dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True)
        self.pending += [(param, work)]


def hook_with_extend(pending):
    """Right, in another style: a lambda and list.extend."""
    return lambda param: pending.extend(
        [(param, dist.all_reduce(param.grad, async_op=True))])


def test_hooks_in_other_styles_pass(verdict):
    for right in (_HookObject, hook_with_extend):
        passed, seen = verdict("ddp_grad_hook", right)
        assert passed, seen


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ddp_grad_hook", blocking_hook, "async_op=True"),
    ("ddp_grad_hook", forgetful_hook, "(work.wait()) before backward went on"),
    ("ddp_grad_hook", reduces_the_parameter, "not the parameter itself"),
    ("ddp_grad_hook", waits_inside_the_hook, "(work.wait()) before backward went on"),
    ("ddp_grad_hook", divides_before_the_sum, ("divided by the world size before",
                                               "torch's reducer divides first too")),
    ("ddp_grad_hook", averages_with_reduce_op_avg, ("op=ReduceOp.AVG", "divided twice")),
    ("ddp_grad_hook", appends_only_the_work, ("append one pair (param, work)", "each work,")),
    ("ddp_grad_hook", waits_on_the_future, "a wait on the work's future"),
    ("ddp_grad_hook", reduces_a_copy, "the sum went into another tensor"),
    ("ddp_grad_hook", returns_the_work, "your hook returned a value (work)"),
    ("ddp_grad_hook", divides_while_in_flight, "changed while its all-reduce was in flight"),
    ("ddp_grad_hook", forgets_to_return_the_hook, "my_make_hook returned a NoneType"),
    ("ddp_grad_hook", appends_work_then_param, ("each (work, param)", "the parameter itself first")),
    ("ddp_grad_hook", waits_with_wait_all, "a wait on the work's future"),
    ("ddp_grad_hook", weights_only, "all-reduces for 4 parameters"),
    ("ddp_grad_hook", once_per_parameter_ever,
     ("on the next one", "keep no state of its own")),
]
