"""Checkers for notebook 08's exercises: a parameter server, a split layer.

The server's update rule is first driven push by push here in the kernel, on
a real `ParameterServer` without RPC, so that a wrong answer can be pinned to
the push where it went wrong and compared with each typical mistake (a step
on every push, the sum instead of the average, an accumulator or a count
never reset); a rule that passes then trains over RPC on 3 ranks against
full-batch SGD. The column-parallel layer runs on 2 and 3 ranks against
`nn.Linear`; wrong outputs are compared with what concatenating along the
batch, forgetting the bias, all-reducing instead of all-gathering, or
mixing up the order of the slices would give.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

WORKERS, ROUNDS, LR = 3, 2, 0.1
E2E_STEPS = 3
BATCH, IN, OUT = 3, 5, 6  # OUT splits into 2 and into 3 slices


def _model():
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def _grads(worker, round_):
    g = torch.Generator().manual_seed(100 * round_ + worker)
    return [torch.randn(2, 3, generator=g), torch.randn(2, generator=g)]


def _params(server):
    return [p.detach().clone() for p in server.params]


def _close(a, b):
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


def _sgd(params, grads, scale=1.0):
    return [p - LR * scale * g for p, g in zip(params, grads)]


def _total(grads_list):
    return [sum(parts) for parts in zip(*grads_list)]


def check_server_update(fn) -> Verdict:
    from ddp_teach.paramserver import ParameterServer
    server = ParameterServer(_model(), WORKERS, LR, update=fn)
    seen = []  # every round's pushed gradients, for the mistakes' answers
    for round_ in range(ROUNDS):
        round_grads = [_grads(w, round_) for w in range(WORKERS)]
        seen.append(round_grads)
        before = _params(server)
        for w, grads in enumerate(round_grads):
            try:
                stepped = fn(server, [g.clone() for g in grads])
            except NotImplementedError:
                return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
            except Exception as exc:
                return Verdict(WRONG, f"push {w + 1} of round {round_ + 1} "
                               f"raised {type(exc).__name__}: {exc}")
            now = _params(server)
            where = (f"round {round_ + 1}, after push {w + 1} of "
                     f"{WORKERS}: ")
            if w < WORKERS - 1:
                if not _close(now, before) or stepped:
                    return Verdict(WRONG, where + "the server already stepped."
                                   "\nHint: a synchronous server waits until "
                                   "EVERY worker has pushed (count the pushes "
                                   "in server.pushes) before it steps; until "
                                   "then, only add to server.pending and "
                                   "return False.")
                continue
            total = _total(round_grads)
            if _close(now, _sgd(before, total, 1 / WORKERS)):
                if not stepped:
                    return Verdict(WRONG, where + "the parameters are right, "
                                   "but the function did not return True.\n"
                                   "Hint: return True when you stepped: the "
                                   "server then answers the waiting workers.")
                continue
            shown = where + "the parameters are not those of SGD with the " \
                "average of this round's gradients.\nHint: "
            if _close(now, _sgd(before, total)):
                return Verdict(WRONG, shown + "you stepped with the SUM of the "
                               "workers' gradients; divide by "
                               "server.num_workers (DDP averages too).")
            if round_ and _close(now, _sgd(before, _total(
                    seen[0] + round_grads), 1 / WORKERS)):
                return Verdict(WRONG, shown + "round 1's gradients were "
                               "still in the accumulator: zero server.pending "
                               "after the step.")
            if round_ and _close(now, before):
                return Verdict(WRONG, shown + "round 2 never stepped: set "
                               "server.pushes back to 0 after the step.")
            if _close(now, before):
                return Verdict(WRONG, shown + "nothing changed: put the "
                               "average into each parameter's .grad, then "
                               "call server.optimizer.step().")
            return Verdict(WRONG, shown + "add each push into server.pending; "
                           "after the last one set param.grad = pending / "
                           "num_workers and call server.optimizer.step().")
    return _check_over_rpc(fn)


def _batch(worker, step):
    g = torch.Generator().manual_seed(10 * step + worker)
    x = torch.randn(4, 3, generator=g)
    return x, x[:, :2].sin()


def _train_on_ranks(rank, world_size, fn):
    from ddp_teach.paramserver import train
    return train(rank, world_size, _model, _batch, E2E_STEPS, LR, update=fn)


def _full_batch_sgd(workers):
    model = _model()
    for step in range(E2E_STEPS):
        model.zero_grad()
        losses = [F.mse_loss(model(x), y) for x, y in
                  (_batch(w, step) for w in range(workers))]
        (sum(losses) / workers).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return [p.detach() for p in model.parameters()]


def _check_over_rpc(fn) -> Verdict:
    results, problem = run_learner_code(_train_on_ranks, 3, fn, timeout=30.0)
    if problem:
        return problem
    want = _full_batch_sgd(2)
    if not _close(results[0]["params"], want):
        return Verdict(WRONG, "push by push it was right, but on a server "
                       "with 2 workers over RPC the parameters after "
                       f"{E2E_STEPS} steps differ from full-batch SGD.\nHint: "
                       "use only the `server` argument's fields; keep no "
                       "state of your own between calls.")
    return Verdict(CORRECT, f"{ROUNDS} rounds of {WORKERS} pushes step by "
                   f"step, then {E2E_STEPS} steps over RPC on a server with 2 "
                   "workers: equal to SGD on the full batch.")


# ---- column-parallel linear ------------------------------------------------

def _linear():
    torch.manual_seed(1)
    layer = nn.Linear(IN, OUT)
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(2))
    return layer, x


def _column_on_ranks(rank, world_size, fn):
    from ddp_teach.tensor_parallel import shard
    layer, x = _linear()
    w = shard(layer.weight.detach(), 0, rank, world_size)
    b = shard(layer.bias.detach(), 0, rank, world_size)
    try:
        out = fn(x.clone(), w, b)
    except NotImplementedError:
        return NOT_ATTEMPTED
    return out.detach() if isinstance(out, torch.Tensor) else out


def _column_hint(got, world_size) -> str | None:
    layer, x = _linear()
    with torch.no_grad():
        want = layer(x)
        no_bias = F.linear(x, layer.weight)
    slices = want.chunk(world_size, dim=-1)
    if not isinstance(got, torch.Tensor):
        return (f"the function returned a {type(got).__name__}; return the "
                "output tensor.")
    if got.shape == want.shape and torch.allclose(got, want, atol=1e-5):
        return None
    if got.shape == (world_size * BATCH, OUT // world_size) and torch.allclose(
            got, torch.cat(slices, dim=0), atol=1e-5):
        return ("you concatenated along dim 0, the batch: the slices are "
                "output FEATURES, so concatenate along the last dim "
                "(torch.cat(slices, dim=-1)).")
    if got.shape == slices[0].shape:
        if torch.allclose(got, sum(slices), atol=1e-5):
            return ("all_reduce ADDED the slices, but they are different "
                    "output features, not partial sums: all_gather them "
                    "into a list and concatenate along the last dim.")
        if any(torch.allclose(got, s, atol=1e-5) for s in slices):
            return ("that is only this rank's slice of the outputs: "
                    "all_gather every rank's slice and concatenate them.")
    if got.shape == want.shape:
        if torch.allclose(got, no_bias, atol=1e-5):
            return ("the bias is missing: pass bias_shard to F.linear (each "
                    "rank adds the bias of its own output features).")
        if torch.allclose(got.sort(-1).values, want.sort(-1).values,
                          atol=1e-5):
            return ("the right numbers in the wrong order: all_gather fills "
                    "the list in rank order; concatenate it as it is.")
    return ("compute local = F.linear(x, weight_shard, bias_shard), "
            "all_gather it from every rank, and torch.cat the list along "
            "the last dim.")


def check_column_parallel(fn) -> Verdict:
    for world_size in (2, 3):
        results, problem = run_learner_code(_column_on_ranks, world_size, fn)
        if problem:
            return problem
        for rank, got in enumerate(results):
            hint = _column_hint(got, world_size)
            if hint:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else "-"
                return Verdict(WRONG, f"on {world_size} ranks, rank {rank}: "
                               f"expected the output of nn.Linear({IN}, {OUT})"
                               f" on a batch of {BATCH}, shape "
                               f"({BATCH}, {OUT}); got shape {shape}.\n"
                               f"Hint: {hint}")
    return Verdict(CORRECT, f"equal to nn.Linear({IN}, {OUT}) on 2 and 3 "
                            "ranks, on every rank.")


register(Exercise(
    "param_server_update", "The parameter server's update", "my_server_update",
    "ddp_teach.paramserver:sync_update", check_server_update,
    ["Add the pushed gradients into server.pending and count the push in "
     "server.pushes; return False until server.num_workers have pushed.",
     "After the last push: param.grad = pending / server.num_workers for "
     "each parameter, then server.optimizer.step().",
     "Then zero server.pending, set server.pushes = 0 and return True."]))
register(Exercise(
    "column_parallel_linear", "A column-parallel linear layer",
    "my_column_parallel_forward",
    "ddp_teach.tensor_parallel:column_parallel_forward", check_column_parallel,
    ["Each rank computes its slice of the outputs with no communication: "
     "F.linear(x, weight_shard, bias_shard).",
     "dist.all_gather(list_of_empty_like, local) collects every rank's "
     "slice, in rank order.",
     "torch.cat(the_list, dim=-1): the slices are output features, side "
     "by side."]))
