"""Checker for notebook 03's gradient hook: `my_make_hook(pending)` returns
the hook that DDP's reducer registers on every parameter.

What the reference, `dt.ddp.make_allreduce_hook`, guarantees, each property
checked on 2 and 3 real ranks, with the hint that names the mistake:
- `my_make_hook` returns the hook, a function that returns None (autograd
  refuses a post-accumulate-grad hook that returns a value);
- each parameter's hook starts exactly one all-reduce, of `param.grad`
  itself (in place), a SUM (the finishing step after backward divides),
  with async_op=True;
- nothing waits for it inside backward: no `work.wait()`, no wait on its
  future; backward goes on while the sum travels (the overlap);
- `param.grad` is left alone while its all-reduce is in flight;
- `(param, work)` is appended to `pending`, the parameter itself and the
  all-reduce's handle, once per parameter; the parameters do not change;
- the same at the next backward (pending emptied and the gradients set
  to None between them, as a training step does): a hook that keeps state
  of its own, never reset, goes wrong on the second backward.

The checker makes waiting visible (nb03_held_allreduce.py): every async
all-reduce runs on a buffer of its own, and its sum lands in `param.grad`
(and its future completes) only when the checker releases it after
backward, or when its work's `wait()` is called. A hook that waits on the
future inside backward therefore stands still until the checker releases
it.
"""
import torch

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import attempt, run_learner_code
from ddp_teach.exercises.nb03_held_allreduce import HeldAllReduce, Spy, backward_watched
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG,
                                         Exercise, Verdict, register)

WORLD_SIZES = (1, 2, 3, 5)  # small to large, 5 not a power of two
PARAM_NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]  # small_model()'s


def small_model():
    """The checkers' model (nb03_finish uses it too)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def batch_of(rank):
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(10 + rank))


def _local_grads(rank):
    """One rank's own gradients, before any all-reduce."""
    model = small_model()
    model(batch_of(rank)).square().mean().backward()
    return [p.grad for p in model.parameters()]


def _describe(value, params) -> str:
    """What the learner handed over, in the exercise's words."""
    if isinstance(value, HeldAllReduce):
        return "work"
    if any(value is p for p in params):
        return "param"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v, params) for v in value) + ")"
    return type(value).__name__


def _hook_on_ranks(rank, world_size, make_hook):
    model, pending, returned = small_model(), [], []
    params = list(model.parameters())
    hook = attempt(make_hook, pending)
    if hook is NOT_ATTEMPTED:
        return NOT_ATTEMPTED
    if not callable(hook):
        return {"not_a_function": type(hook).__name__}

    def called(param):  # what autograd calls: the learner's hook, its value noted
        value = hook(param)
        if value is not None:
            returned.append(_describe(value, params))

    for p in params:
        p.register_post_accumulate_grad_hook(called)
    before = [p.detach().clone() for p in params]
    spy = Spy(params)
    stuck = backward_watched(model(batch_of(rank)).square().mean(), spy)
    entries = [entry for entry in pending if isinstance(entry, tuple) and len(entry) == 2]
    seen = {"returned": returned, "stuck": stuck, "calls": spy.calls,
            "waited": any(h.waited for h in spy.held),
            "written": any(h.written_in_flight for h in spy.held),
            "pending": [_describe(e, params) for e in pending], "pairs": len(entries),
            "params_first": sum(any(e[0] is p for p in params) for e in entries),
            "works": sum(callable(getattr(e[1], "wait", None)) for e in entries),
            "params_changed": any(not torch.equal(p, b) for p, b in zip(params, before)),
            "grads": [p.grad.clone() for p in params]}
    for entry in entries:
        if callable(getattr(entry[1], "wait", None)):
            entry[1].wait()
    seen.update(_second_step(model, rank, params, pending))
    return seen


def _second_step(model, rank, params, pending) -> dict:
    """The next training step: `pending` emptied and the gradients set to
    None (as the finishing step and zero_grad do), then backward again, with
    the same hooks. What the hooks did this time."""
    pending.clear()
    for p in params:
        p.grad = None
    spy = Spy(params)
    backward_watched(model(batch_of(rank)).square().mean(), spy)
    again = [e for e in pending if isinstance(e, tuple) and len(e) == 2]
    for entry in again:
        if callable(getattr(entry[1], "wait", None)):
            entry[1].wait()
    return {"second_calls": len(spy.calls), "second_pairs": len(again),
            "second_grads": [None if p.grad is None else p.grad.clone()
                             for p in params]}


def _results_hint(seen, world_size, rank_sums, local) -> str | None:
    """A hint for sums that are wrong, from what the grads hold."""
    got = seen["grads"]

    def holds(expected):
        return all(torch.allclose(g, e, atol=1e-6) for g, e in zip(got, expected))
    if holds([s / world_size for s in rank_sums]):
        if any(c["average"] for c in seen["calls"]):
            return ("op=ReduceOp.AVG averaged in the all-reduce. That is a "
                    "valid way elsewhere (NCCL averages natively; gloo sums, "
                    "then divides), but here the step "
                    "after backward divides by the world size, so your "
                    "gradients end up divided twice. Leave op at its "
                    "default, SUM.")
        return ("param.grad was divided by the world size before its "
                "all-reduce. torch's reducer divides first too, which is "
                "fine, but in this exercise the step after backward divides "
                "(it waits, then averages), so your gradients end up divided "
                "twice. The hook only starts the SUM.")
    if holds(local) or holds([g / world_size for g in local]):
        return ("param.grad still holds this rank's own gradient: the sum "
                "went into another tensor (a copy such as param.grad.clone() "
                "or param.grad / world_size) and was thrown away. All-reduce "
                "param.grad itself, in place.")
    if any(torch.allclose(g, s, atol=1e-6) for g, s in zip(got, rank_sums)):
        return ("some gradients hold the sum, others their rank's own: every "
                "parameter's hook must start an all-reduce of its gradient.")
    return None


def check_grad_hook(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_hook_on_ranks, world_size, fn)
        if problem:
            return problem
        seen = results[0]
        where = f"on {world_size} rank{'s' * (world_size > 1)}, rank 0: "
        n_params = len(seen.get("grads", []))
        if "not_a_function" in seen:
            return Verdict(WRONG, where + f"my_make_hook returned a {seen['not_a_function']}"
                           ", not a function.\nHint: define hook(param) inside "
                           "my_make_hook and return it (without calling it).")
        if seen["returned"]:
            return Verdict(WRONG, where + f"your hook returned a value ({seen['returned'][0]}): "
                           "autograd refuses a post-accumulate-grad hook that "
                           "returns a value ('expected Variable, but hook "
                           "returned ...').\nHint: the hook returns nothing; "
                           "it appends (param, work) to `pending`.")
        if not seen["calls"]:
            return Verdict(WRONG, where + "the hook started no all-reduce.\nHint: "
                           "dist.all_reduce(param.grad, async_op=True).")
        if not all(c["async"] for c in seen["calls"]):
            return Verdict(WRONG, where + "dist.all_reduce ran to the end inside "
                           "backward (async_op was not True): nothing "
                           "overlapped.\nHint: pass async_op=True, so the sum "
                           "travels while backward computes the next gradients.")
        if seen["waited"] or seen["stuck"]:
            how = "work.wait()" if seen["waited"] else "a wait on the work's future"
            return Verdict(WRONG, where + f"the hook waited for its all-reduce ({how}) "
                           "before backward went on: backward stood still "
                           "until the sum arrived, as with a blocking call, so "
                           "nothing overlapped.\nHint: the hook only starts the "
                           "all-reduce and appends (param, work); the step "
                           "after backward waits.")
        if any(c["parameter"] for c in seen["calls"]) or seen["params_changed"]:
            return Verdict(WRONG, where + "the hook all-reduced the parameter, and the "
                           "parameters changed.\nHint: all-reduce param.grad, "
                           "not the parameter itself.")
        if len(seen["calls"]) != n_params:
            return Verdict(WRONG, where + f"{len(seen['calls'])} all-reduces for "
                           f"{n_params} parameters.\nHint: each hook call "
                           "starts one all-reduce, of its own parameter's "
                           "gradient.")
        if seen["written"]:
            return Verdict(WRONG, where + "param.grad was changed while its all-reduce "
                           "was in flight (a division after starting it?): "
                           "until the work completes, the tensor belongs to "
                           "the collective, and on a real network your "
                           "change and the sum race.\nHint: start the "
                           "all-reduce and leave the gradient alone.")
        if seen["pairs"] != len(seen["pending"]) or seen["pairs"] != n_params \
                or seen["params_first"] != n_params or seen["works"] != n_params:
            kinds = sorted(set(seen["pending"])) or ["nothing"]
            return Verdict(WRONG, where + f"`pending` held {len(seen['pending'])} entries, "
                           f"each {' or '.join(kinds)}, for {n_params} "
                           "parameters.\nHint: append one pair (param, work) per "
                           "call: the parameter itself first, then the work "
                           "dist.all_reduce returned, so the step after "
                           "backward knows which gradient each work fills.")
        local = [_local_grads(rank) for rank in range(world_size)]
        rank_sums = [sum(grads) for grads in zip(*local)]
        if all(torch.allclose(g, s, atol=1e-6) for g, s in zip(seen["grads"], rank_sums)):
            if seen["second_calls"] != n_params or seen["second_pairs"] != n_params \
                    or not all(g is not None and torch.allclose(g, s, atol=1e-6)
                               for g, s in zip(seen["second_grads"], rank_sums)):
                return Verdict(WRONG, where + "the first backward "
                               "was right, but on the next one (pending emptied, "
                               "the gradients set to None, as a training step "
                               f"does) the hooks started {seen['second_calls']} "
                               f"all-reduces and appended {seen['second_pairs']} "
                               f"pairs for {n_params} parameters.\nHint: the "
                               "hook runs at every backward of the training: "
                               "keep no state of its own that is never reset "
                               "(a set of parameters already seen, a flag, a "
                               "counter); start one all-reduce per call.")
            continue
        hint = _results_hint(seen, world_size, rank_sums, local[0])
        differ = first_difference(seen["grads"], rank_sums, PARAM_NAMES)
        return Verdict(WRONG, where + "the gradients after backward are not "
                       f"the sum over the ranks: {differ}.\nHint: " + (hint or "all-reduce param.grad "
                       "itself (in place) with the default op, SUM, once per "
                       "parameter."))
    return Verdict(CORRECT, "one async SUM of param.grad per parameter, started "
                            "in backward and not waited for there, (param, "
                            f"work) appended, on {WORLD_SIZES} ranks.")


register(Exercise(
    "ddp_grad_hook", "The gradient hook", "my_make_hook",
    "ddp_teach.ddp:make_allreduce_hook", check_grad_hook,
    ["Return an inner function hook(param) that closes over `pending` and "
     "returns nothing.",
     "Inside: start the all-reduce of param.grad with async_op=True, and "
     "append the pair (param, work) to pending; do not wait, do not divide."]))
