"""Checker for notebook 10's parameter-server exercise (the column-parallel
layer is checked in nb09_tensor_parallel.py).

`my_server_update(server, grads)`: the synchronous update rule of a
parameter server (Li et al., OSDI 2014). What the reference,
`ddp_teach.paramserver.sync_update`, guarantees, and how each property is
checked. The rule is first driven push by push here in the kernel, on a
real `ParameterServer` without RPC, with 3 workers and then with 1, two
rounds each, so that a wrong answer is pinned to the push where it went
wrong:

- no step before every worker has pushed: after each earlier push the
  parameters are unchanged and the rule returns False;
- the step is the average: after the last push the parameters are those
  of the server's optimizer stepped with the mean of the round's
  gradients, and the rule returns True;
- the server's optimizer takes the step: here it is SGD with momentum,
  whose state carries from round to round, so an update written by hand
  goes wrong in round 2;
- each round starts afresh: the accumulator and the count are reset, so
  round 2 steps with round 2's gradients, after its own last push;
- one worker: every push is the last of its round.

A rule that passes then trains over RPC on 3 ranks (a server and 2
workers) against full-batch SGD: it must keep no state of its own between
calls. Wrong answers are compared with each typical mistake (a step on
every push, the sum instead of the average, an accumulator or a count
never reset, the accumulator rebound instead of added to, a step one push
late, a hand-written update), so that the hint names it.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, TODO_MESSAGE,
                                         WRONG, Exercise, Verdict, register)

WORKER_COUNTS, ROUNDS, LR, MOMENTUM = (3, 1), 2, 0.1, 0.9
E2E_STEPS = 3


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


def _optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def _replay(round_grads, momentum=True):
    """The parameters after stepping with each gradient list in turn, with
    the server's optimizer (or plain SGD, as a hand-written update)."""
    params = [p.detach().clone().requires_grad_() for p in _model().parameters()]
    optimizer = (_optimizer if momentum else
                 lambda ps: torch.optim.SGD(ps, lr=LR))(params)
    for grads in round_grads:
        for param, grad in zip(params, grads):
            param.grad = grad.clone()
        optimizer.step()
    return [p.detach() for p in params]


def _total(grads_list):
    return [sum(parts) for parts in zip(*grads_list)]


def _mean(grads_list):
    return [total / len(grads_list) for total in _total(grads_list)]


def _wrong_step_hint(seen, round_, workers, before, now, server) -> str:
    """Why the parameters after a round's last push are wrong."""
    done = [_mean(r) for r in seen[:round_]]
    if _close(now, _replay(done + [_total(seen[round_])])):
        return ("you stepped with the SUM of the workers' gradients; divide by "
                "server.num_workers (DDP averages too).")
    if round_ and _close(now, _replay(done + [[t / workers for t in _total(
            seen[0] + seen[round_])]])):
        return "round 1's gradients were still in the accumulator: zero server.pending after the step."
    if round_ and _close(now, _replay([_mean(r) for r in seen[:round_ + 1]],
                                      momentum=False)):
        return ("the parameters moved as plain SGD moves them, without the "
                "momentum of server.optimizer: put the average into each "
                "parameter's .grad and call server.optimizer.step(), which "
                "keeps the optimizer's state from round to round.")
    if _close(now, before):
        if server.pushes == workers:
            return ("after the last push (server.pushes == num_workers) the "
                    "rule did not step: it waits for one push too many. "
                    "Compare the count with num_workers after counting this "
                    "push.")
        if round_ and server.pushes > workers:
            return ("round 2 never stepped: the count went on from round 1. "
                    "Set server.pushes back to 0 after the step.")
        if all(not t.any() for t in server.pending):
            return ("server.pending is still zero after the pushes: "
                    "`total = total + grad` only rebinds a loop variable. Add "
                    "in place (total += grad, or total.add_(grad)).")
        return ("nothing changed: put the average into each parameter's "
                ".grad, then call server.optimizer.step().")
    return ("add each push into server.pending; after the last one set "
            "param.grad = pending / num_workers and call "
            "server.optimizer.step().")


def _drive(fn, workers) -> Verdict | None:
    """Push by push, ROUNDS rounds of `workers` pushes; a Verdict at the
    first push that goes wrong, else None."""
    from ddp_teach.paramserver import ParameterServer
    server = ParameterServer(_model(), workers, LR, update=fn)
    server.optimizer = _optimizer(server.params)  # momentum: state across rounds
    seen = []  # every round's pushed gradients, for the mistakes' answers
    for round_ in range(ROUNDS):
        round_grads = [_grads(w, round_) for w in range(workers)]
        seen.append(round_grads)
        before = _params(server)
        for w, grads in enumerate(round_grads):
            where = (f"{workers} worker{'s' * (workers > 1)}, round "
                     f"{round_ + 1}, after push {w + 1} of {workers}: ")
            try:
                stepped = fn(server, [g.clone() for g in grads])
            except NotImplementedError:
                return Verdict(NOT_ATTEMPTED, TODO_MESSAGE)
            except Exception as exc:
                return Verdict(WRONG, where + f"your function raised "
                               f"{type(exc).__name__}: {exc}")
            now = _params(server)
            if w < workers - 1:
                if not _close(now, before) or stepped:
                    return Verdict(WRONG, where + "the server already stepped."
                                   "\nHint: a synchronous server waits until "
                                   "EVERY worker has pushed (count the pushes "
                                   "in server.pushes) before it steps; until "
                                   "then, only add to server.pending and "
                                   "return False.")
                continue
            if _close(now, _replay([_mean(r) for r in seen])):
                if stepped is not True:
                    return Verdict(WRONG, where + "the parameters are right, "
                                   f"but the function returned {stepped!r}, "
                                   "not True.\nHint: return True when you "
                                   "stepped: the server then answers the "
                                   "waiting workers.")
                continue
            return Verdict(WRONG, where + "the parameters are not those of "
                           "the server's optimizer stepped with the average "
                           "of this round's gradients.\nHint: " + _wrong_step_hint(
                               seen, round_, workers, before, now, server))
    return None


def check_server_update(fn) -> Verdict:
    for workers in WORKER_COUNTS:
        found = _drive(fn, workers)
        if found:
            return found
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
    return Verdict(CORRECT, f"{ROUNDS} rounds push by push with 3 workers and "
                   f"with 1, against SGD with momentum on the average, then "
                   f"{E2E_STEPS} steps over RPC on a server with 2 workers: "
                   "equal to SGD on the full batch.")


register(Exercise(
    "param_server_update", "The parameter server's update", "my_server_update",
    "ddp_teach.paramserver:sync_update", check_server_update,
    ["Add the pushed gradients into server.pending and count the push in "
     "server.pushes; return False until server.num_workers have pushed.",
     "After the last push: param.grad = pending / server.num_workers for "
     "each parameter, then server.optimizer.step().",
     "Then zero server.pending, set server.pushes = 0 and return True."]))
