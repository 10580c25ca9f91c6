"""Checker for notebook 06's ZeRO-1 exercise, on real ranks (clipping a
sharded gradient is checked in nb06_clip.py, ZeRO-3 in nb06_zero3.py).

`zero1_step(flat_params, flat_grads, shard, optimizer)`: shard assignment
and the ZeRO-1 step (Rajbhandari et al. 2020, P_os). What the reference,
`ddp_teach.zero.zero1_step`, guarantees, and how each property is checked
(on 1 to 5 ranks, 4 steps of AdamW and of SGD with momentum each; SGD
is there because Adam barely notices a gradient N times too large):

- values: after every step `flat_params` holds, on every rank, what the
  unsharded optimizer gives the whole vector (compared after 4 steps);
- written in place and in order: `flat_params` itself is written (an
  all-gather into it, or a copy into it), after `optimizer.step()`; a
  rebound local name or a gather before the step leaves it unchanged;
- state: the optimizer it was given takes the step, so it holds state for
  the shard (and only the shard: the memory ZeRO-1 saves), kept from step
  to step;
- `flat_grads` is read only: it is the caller's averaged gradient, and
  after the call it holds what it held before;
- no aliasing: `shard.grad` does not share memory with `flat_grads`; the
  caller reuses that buffer for the next backward (DDP does, with
  `gradient_as_bucket_view`), and a view would change the shard's gradient
  under the optimizer's feet;
- one rank: the chunk is the whole vector, and the step still works.

Nothing here is hashed, so processes with different hash seeds cannot
differ. A wrong result is compared with what each typical mistake would
produce (every rank taking chunk 0, no all-gather, the gradient summed
over ranks again or divided by their number again, the given optimizer
never stepped), so that the hint names it.
"""
import torch
import torch.distributed as dist
from torch import nn

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

LENGTH, STEPS = 60, 4  # 60 elements split evenly over 1 to 5 ranks
WORLD_SIZES = (1, 2, 3, 4, 5)
OPTIMIZERS = {
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.1, weight_decay=0.1),
    "SGD with momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}
GATHERS = ("all_gather_single", "all_gather_into_tensor", "all_gather")


def _initial_params():
    return torch.linspace(-1.0, 1.0, LENGTH)


def _grads(step):
    """The averaged gradient at `step`: the same on every rank."""
    return torch.randn(LENGTH, generator=torch.Generator().manual_seed(step))


def _shares_memory(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _watch_gathers(events):
    """Record each all-gather call in `events`; returns a function that
    puts torch's own back."""
    real = {name: getattr(dist, name) for name in GATHERS}

    def watched(name):
        def gather(output, *args, **kwargs):
            events.append("gather")
            return real[name](output, *args, **kwargs)
        return gather
    for name in GATHERS:
        setattr(dist, name, watched(name))
    return lambda: [setattr(dist, name, fn) for name, fn in real.items()]


def _zero1_on_ranks(rank, world_size, fn):
    size = LENGTH // world_size
    results = {}
    for name, make_optimizer in OPTIMIZERS.items():
        flat = _initial_params()
        shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone())
        optimizer = make_optimizer([shard])
        events, grads_changed, aliased = [], False, False
        optimizer.register_step_post_hook(lambda *_: events.append("step"))
        restore = _watch_gathers(events)
        try:
            for step in range(STEPS):
                grads = _grads(step)
                fn(flat, grads, shard, optimizer)
                grads_changed |= not torch.equal(grads, _grads(step))
                aliased |= _shares_memory(shard.grad, grads)
        except NotImplementedError:
            return NOT_ATTEMPTED
        finally:
            restore()
        state = optimizer.state.get(shard, {})
        stepped = any(isinstance(v, torch.Tensor) and v.numel() == size
                      for v in state.values())
        before_step = events[:events.index("step")] if "step" in events else []
        results[name] = dict(flat=flat.clone(), stepped=stepped,
                             grads_changed=grads_changed, aliased=aliased,
                             gathered_before_step=any(
                                 e.startswith("gather") for e in before_step))
    return results


def _simulate(make_optimizer, world_size, grad_of_chunk):
    """The flat vector after STEPS, each chunk r stepped with
    grad_of_chunk(step, r) by an optimizer of its own."""
    size = LENGTH // world_size
    chunks = []
    for rank in range(world_size):
        chunk = nn.Parameter(_initial_params()[rank * size:(rank + 1) * size])
        optimizer = make_optimizer([chunk])
        for step in range(STEPS):
            chunk.grad = grad_of_chunk(step, rank).clone()
            optimizer.step()
        chunks.append(chunk.detach())
    return torch.cat(chunks)


def _values_hint(got, make_optimizer, world_size, rank) -> str:
    size = LENGTH // world_size

    def chunk(step, r):
        return _grads(step)[r * size:(r + 1) * size]

    flat = got["flat"]
    if torch.allclose(flat, _simulate(make_optimizer, world_size,
                                      lambda step, r: chunk(step, 0))):
        return ("every rank stepped with chunk 0 of the gradient: rank r owns "
                "elements [r*S, (r+1)*S), S = len(flat_params) // world_size.")
    mine = slice(rank * size, (rank + 1) * size)
    others = torch.ones(LENGTH, dtype=torch.bool)
    others[mine] = False
    if others.any() and torch.equal(flat[others], _initial_params()[others]):
        return ("the other ranks' chunks never changed: after the step, "
                "all-gather every rank's shard into flat_params.")
    if torch.allclose(flat, _simulate(make_optimizer, world_size,
                                      lambda step, r: chunk(step, r) * world_size)):
        return ("the gradient is world_size times too large: flat_grads is "
                "already averaged over the ranks, so take your slice of it "
                "as it is, with no further reduce.")
    if torch.allclose(flat, _simulate(make_optimizer, world_size,
                                      lambda step, r: chunk(step, r) / world_size)):
        return ("the gradient is world_size times too small: flat_grads is "
                "already averaged over the ranks (DDP divided by world_size), "
                "so do not divide it again.")
    if not got["stepped"]:
        return ("step the optimizer you were given: it owns the shard and "
                "keeps its state (momentum, Adam's moments) from step to step.")
    return ("put your slice of flat_grads in shard.grad, call "
            "optimizer.step(), then all-gather the shards into flat_params.")


def _first_problem(got, make_optimizer, world_size, rank, want) -> str | None:
    """The hint for the first property `got` breaks, or None."""
    if got["grads_changed"]:
        return ("flat_grads was changed in place. It is the caller's "
                "gradient, already averaged over the ranks: read your slice "
                "of it, and change nothing in it.")
    if not torch.allclose(got["flat"], want, rtol=1e-5, atol=1e-6):
        if got["gathered_before_step"]:
            return ("the shards were all-gathered BEFORE optimizer.step(), "
                    "so flat_params received the old values. Step first, "
                    "then all-gather the updated shards into flat_params.")
        if torch.equal(got["flat"], _initial_params()):
            return ("flat_params never changed: write the gathered values "
                    "into it in place (all-gather straight into it, or "
                    "flat_params.copy_(...)). `flat_params = ...` only "
                    "rebinds a name inside your function; the caller's "
                    "tensor stays as it was.")
        return _values_hint(got, make_optimizer, world_size, rank)
    if not got["stepped"]:
        return ("the parameters are right, but the optimizer you were given "
                "holds no state for the shard. Step IT, on the shard only: "
                "an optimizer over the whole vector keeps state for all of "
                "it, the memory ZeRO-1 saves.")
    if got["aliased"]:
        return ("shard.grad is a view into flat_grads: they share memory. "
                "The caller reuses that buffer for the next backward, which "
                "would then change the shard's gradient too; give shard.grad "
                "memory of its own (a copy of your slice).")
    return None


def check_zero1_step(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_zero1_on_ranks, world_size, fn,
                                            timeout=60.0)
        if problem:
            return problem
        for name, make_optimizer in OPTIMIZERS.items():
            want = _simulate(make_optimizer, 1, lambda step, _: _grads(step))
            for rank, rank_results in enumerate(results):
                got = rank_results[name]
                hint = _first_problem(got, make_optimizer, world_size, rank, want)
                if hint:
                    differ = first_difference([got["flat"]], [want],
                                              ["flat_params"])
                    values = f" {differ}" if differ else ""
                    return Verdict(WRONG, (
                        f"{name}, {world_size} rank{'s' * (world_size > 1)}, "
                        f"rank {rank}, after {STEPS} steps:{values}\n"
                        f"Hint: {hint}"))
    return Verdict(CORRECT, "equal to the unsharded optimizer (AdamW and SGD "
                            "with momentum) on 1 to 5 ranks, written into "
                            "flat_params after the step, with optimizer state "
                            "for one shard per rank, flat_grads left as it "
                            "was and shard.grad in memory of its own.")


register(Exercise(
    "zero1_step", "Shard assignment and the ZeRO-1 step", "zero1_step",
    "ddp_teach.zero:zero1_step", check_zero1_step,
    ["Rank r owns elements [r*S, (r+1)*S) of the flat vector, "
     "S = len(flat_params) // world_size.",
     "Put a copy of that slice of flat_grads into shard.grad and call "
     "optimizer.step(): it updates the shard, and keeps optimizer state for "
     "it alone.",
     "Then dist.all_gather_single(flat_params, shard.detach()) writes every "
     "rank's updated shard into flat_params, in rank order."]))
