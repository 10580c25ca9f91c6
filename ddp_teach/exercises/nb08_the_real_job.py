"""Checkers for notebook 08's exercises: the wrap order, and gradient
accumulation under FSDP2. Both run the learner's function on real gloo ranks.

`my_shard_model(model, mesh)`: the reference, `ddp_teach.real_job.
shard_model`, applies fully_shard to each block, then to the root. Checked
on 3 and 2 ranks, on a model of 3 blocks, after one forward and backward:

- the root and every block are FSDP modules (`FSDPModule`): a block left
  out is gathered with the root, all at once;
- every parameter is a DTensor on the given mesh: blocks without the root
  leave the embedding, the final norm and the output whole on every rank,
  and their gradients are never averaged;
- one reduce-scatter per unit in backward (blocks + 1, counted in the
  traced run): the root alone gives one;
- the gradients are the average of the ranks' unsharded gradients;
- the root wrapped before its blocks makes torch fail (in 2.13 with
  "Invariant encountered"): the checker names the order instead.

`my_fsdp_accumulate(model, micro_batches)`: the reference, `ddp_teach.real_job.
accumulate_gradients`, runs each micro-batch's forward and backward with
FSDP2's gradient sync off for all but the last, each loss divided by the
number of micro-batches. Checked on 2 ranks (3 micro-batches, then 1) and
3 ranks (2), on a sharded model of 3 blocks, with FSDP2's reduce-scatters
counted (`real_job.collectives_seen`): one reduce-scatter per unit (blocks + 1) for the whole
call, and the gradients equal to one backward of all the rows at once,
averaged over the ranks (fp32, the same rows: a different order of
addition only, hence rtol 1e-4). Gradients N times too large name the
division; one reduce-scatter per micro-batch names the sync; none names
the last micro-batch's sync.

`my_step_checkpoint_state` is checked in nb08_step_checkpoint.py.
"""
import torch
import torch.distributed as dist

from ddp_teach.exercises.difference import first_difference
from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)
from ddp_teach.llama import Llama, LlamaConfig, next_token_loss
from ddp_teach import real_job

SHARD_WORLD_SIZES = (3, 2)
TIMEOUT_S = 60.0
CONFIG = LlamaConfig(vocab=64, width=32, layers=3, heads=2, kv_heads=1, hidden=64,
                     context=16)


# ---- the wrap order -------------------------------------------------------------

def _tokens(rank):
    return torch.randint(0, CONFIG.vocab, (2, CONFIG.context + 1),
                         generator=torch.Generator().manual_seed(100 + rank))


def _unsharded_grads(world_size):
    """The average over the ranks of each parameter's gradient, unsharded."""
    grads = None
    for rank in range(world_size):
        model = Llama(CONFIG)
        model.init_weights(0)
        tokens = _tokens(rank)
        next_token_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        mine = [p.grad / world_size for p in model.parameters()]
        grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
    return grads


def _shard_on_ranks(rank, world_size, fn):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    model = Llama(CONFIG)
    model.init_weights(0)
    mesh = real_job.cpu_mesh()
    report = {}
    try:
        fn(model, mesh)
        tokens = _tokens(rank)
        dist.barrier()                         # the traced step starts here
        next_token_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    except NotImplementedError:
        return NOT_ATTEMPTED
    except Exception as error:              # judged below, with the order
        report["error"] = f"{type(error).__name__}: {str(error)[:200]}"
    report["root"] = isinstance(model, FSDPModule)
    report["blocks"] = [isinstance(block, FSDPModule) for block in model.layers]
    report["inner"] = any(isinstance(inner, FSDPModule) for block in model.layers
                          for inner in block.modules() if inner is not block)
    report["whole"] = [name for name, p in model.named_parameters()
                       if not isinstance(p, DTensor)]
    report["other_mesh"] = [name for name, p in model.named_parameters()
                            if isinstance(p, DTensor) and p.device_mesh != mesh]
    if "error" not in report:
        report["grads"] = [p.grad.full_tensor() if isinstance(p.grad, DTensor)
                           else p.grad for p in model.parameters()]
    return report


def _reduce_scatters(run) -> int:
    return sum(e.name.startswith("reduce_scatter")
               for e in run.timeline.for_rank(0).after_last_barrier().filter(kind="comm"))


def check_shard_model(fn) -> Verdict:
    names = [name for name, _ in Llama(CONFIG).named_parameters()]
    for world_size in SHARD_WORLD_SIZES:
        run, problem = run_learner_code(_shard_on_ranks, world_size, fn,
                                        timeout=TIMEOUT_S, trace=True)
        if problem:
            return problem
        seen = run[0]
        where = f"on {world_size} ranks, a model of {CONFIG.layers} blocks"
        if "error" in seen and seen["root"] and not all(seen["blocks"]):
            return Verdict(WRONG, f"{where}: torch failed ({seen['error']}) after "
                           f"the root was wrapped before its blocks.\nHint: "
                           f"fully_shard each block first, then the root last: "
                           f"the root's call takes whatever no block holds.")
        if "error" in seen:
            return Verdict(WRONG, f"{where}: the step raised {seen['error']}")
        if not all(seen["blocks"]):
            missing = [i for i, ok in enumerate(seen["blocks"]) if not ok]
            fate = ("pieces of them are units of their own, and what is left (their "
                    "norms) is gathered with the root's parameters for the whole step"
                    if seen["inner"] else "the root gathers their weights with "
                    "everything else, all at once")
            return Verdict(WRONG, f"{where}: block(s) {missing} of model.layers are "
                           f"not FSDP units (FSDPModule): {fate}.\nHint: "
                           f"each block must be its own unit: fully_shard(block, "
                           f"mesh=mesh) for every block in model.layers.")
        if not seen["root"] or seen["whole"]:
            return Verdict(WRONG, f"{where}: {', '.join(seen['whole'][:3])} "
                           f"stayed whole on every rank (the root is not an FSDP "
                           f"module), and their gradients were never averaged "
                           f"over the ranks.\nHint: the root holds the embedding, "
                           f"the final norm and the output: fully_shard(model, "
                           f"mesh=mesh) last.")
        if seen["other_mesh"]:
            return Verdict(WRONG, f"{where}: {seen['other_mesh'][0]} is sharded "
                           f"over another mesh than the one given.\nHint: pass "
                           f"mesh=mesh to every fully_shard call.")
        units, counted = CONFIG.layers + 1, _reduce_scatters(run)
        if counted != units:
            return Verdict(WRONG, f"{where}: backward made {counted} reduce-"
                           f"scatter(s), one per FSDP unit; blocks + root make "
                           f"{units}.\nHint: one fully_shard per block, then one "
                           f"on the root, nothing else.")
        differs = first_difference(seen["grads"], _unsharded_grads(world_size),
                                   names, atol=1e-7, rtol=1e-5)
        if differs:
            return Verdict(WRONG, f"{where}: the gradients are not the average of "
                           f"the ranks' unsharded gradients: {differs}")
    return Verdict(CORRECT, f"every block and the root are FSDP units "
                   f"({CONFIG.layers + 1} reduce-scatters per backward), every "
                   f"parameter is sharded over the mesh, and the gradients are the "
                   f"ranks' average, on {' and '.join(map(str, SHARD_WORLD_SIZES))} "
                   f"ranks.")


# ---- accumulation -------------------------------------------------------------

ACCUMULATIONS = ((2, (3, 1)), (3, (2,)))   # (ranks, micro-batch counts)
ROWS_PER_MICRO_BATCH = 2


def _micro_batches(rank, count):
    tokens = torch.randint(0, CONFIG.vocab, (count * ROWS_PER_MICRO_BATCH,
                                            CONFIG.context + 1),
                           generator=torch.Generator().manual_seed(1000 * count + rank))
    return [(t[:, :-1], t[:, 1:]) for t in tokens.chunk(count)]


def _accumulate_on_ranks(rank, world_size, fn, counts):
    from torch.distributed.tensor import DTensor
    results = {}
    for count in counts:
        model = Llama(CONFIG)
        model.init_weights(0)
        real_job.shard_model(model, real_job.cpu_mesh())
        with real_job.collectives_seen() as calls:
            try:
                fn(model, _micro_batches(rank, count))
            except NotImplementedError:
                return NOT_ATTEMPTED
        scatters = [name for name, _ in calls if name == "reduce-scatter"]
        results[count] = {"scatters": len(scatters), "grads": [
            p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            for p in model.parameters()]}
    return results


def _big_batch_grads(world_size, count):
    """One backward per rank of all its rows at once, averaged over ranks."""
    grads = None
    for rank in range(world_size):
        model = Llama(CONFIG)
        model.init_weights(0)
        inputs, targets = (torch.cat(t) for t in zip(*_micro_batches(rank, count)))
        next_token_loss(model(inputs), targets).backward()
        mine = [p.grad / world_size for p in model.parameters()]
        grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
    return grads


def check_accumulate(fn) -> Verdict:
    names = [name for name, _ in Llama(CONFIG).named_parameters()]
    units = CONFIG.layers + 1
    for world_size, counts in ACCUMULATIONS:
        run, problem = run_learner_code(_accumulate_on_ranks, world_size, fn,
                                        timeout=TIMEOUT_S, args=(counts,))
        if problem:
            return problem
        for count in counts:
            seen = run[0][count]
            where = (f"on {world_size} ranks, {count} micro-batch(es), a model of "
                     f"{units} FSDP units")
            if seen["scatters"] == 0:
                return Verdict(WRONG, f"{where}: no reduce-scatter at all, so the "
                               f"ranks' gradients were never averaged.\nHint: the "
                               f"last micro-batch syncs: "
                               f"model.set_requires_gradient_sync(True) before its "
                               f"backward.")
            if seen["scatters"] != units:
                return Verdict(WRONG, f"{where}: {seen['scatters']} reduce-scatters; "
                               f"syncing only the last micro-batch makes {units}, one "
                               f"per unit.\nHint: model.set_requires_gradient_sync("
                               f"False) before every backward but the last, on the "
                               f"root with recurse left on, so every block follows.")
            if any(g is None for g in seen["grads"]):
                return Verdict(WRONG, f"{where}: some parameters have no gradient.\n"
                               f"Hint: run backward on every micro-batch's loss.")
            want = _big_batch_grads(world_size, count)
            if count > 1 and not first_difference(
                    seen["grads"], [count * g for g in want], names, atol=1e-7, rtol=1e-4):
                return Verdict(WRONG, f"{where}: the gradients are {count} times one "
                               f"big batch's.\nHint: divide each micro-batch's loss "
                               f"by the number of micro-batches, so that their sum is "
                               f"the big batch's mean.")
            differs = first_difference(seen["grads"], want, names, atol=1e-7, rtol=1e-4)
            if differs:
                return Verdict(WRONG, f"{where}: the gradients are not one big "
                               f"batch's: {differs}\nHint: sync on the last "
                               f"micro-batch only; one synced earlier sends its "
                               f"gradient before the later ones are added.")
    return Verdict(CORRECT, f"one reduce-scatter per unit ({units}) whatever the "
                   f"number of micro-batches, and the gradients of one big batch, on "
                   f"2 and 3 ranks.")


register(Exercise(
    "shard_model", "The wrap order: each block, then the root",
    "my_shard_model", "ddp_teach.real_job:shard_model", check_shard_model,
    ["A unit is what one fully_shard call covers: gathered together, freed "
     "together. Which modules should be units in a transformer?",
     "The root's call takes only what no unit below it holds: call it last.",
     "for block in model.layers: fully_shard(block, mesh=mesh); then "
     "fully_shard(model, mesh=mesh)."]))

register(Exercise(
    "fsdp_accumulate", "Accumulation under FSDP2: sync on the last micro-batch",
    "my_fsdp_accumulate", "ddp_teach.real_job:accumulate_gradients", check_accumulate,
    ["Which backward must send the gradients, and what do the others do "
     "with theirs?",
     "model.set_requires_gradient_sync(flag) applies to every FSDP unit in "
     "the model; and the big batch's loss is a mean over all its rows.",
     "for i, (x, y) in enumerate(micro_batches): model.set_requires_gradient_"
     "sync(i == len(micro_batches) - 1); (loss(x, y) / len(micro_batches))."
     "backward()"]))
