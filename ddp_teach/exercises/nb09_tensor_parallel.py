"""Checker for notebook 10's tensor-parallel exercise, on real ranks.

`my_column_parallel_forward(x, weight_shard, bias_shard)`: a linear layer
whose weight is split by rows (output features) over the ranks (Shoeybi et
al., Megatron-LM, 2019). What the reference,
`ddp_teach.tensor_parallel.column_parallel_forward`, guarantees, and how
each property is checked (on 1 to 5 ranks; 60 output features split
into 60, 30, 20, 15 and 12):

- values: every rank returns the whole output, equal to `nn.Linear`'s;
- gradient flow: backward through the output gives `weight_shard` and
  `bias_shard` the gradient of their own output features, as Megatron's
  gather does (its backward keeps this rank's part). Every rank computes
  the same loss from the same output, so a backward that adds the ranks'
  copies counts it world_size times; x's gradient would need an
  all-reduce (Megatron's f) and is not asked for;
- communication: the outputs are gathered, never the weights; a rank that
  gathers the whole weight matrix holds what tensor parallelism exists to
  split. Weights are recognised by their numbers, in any shape (transposed,
  flattened, copied), and a rank may hand all-gather no more numbers than
  its own slice of the output (BATCH < IN here, so a weight shard is larger).

A wrong result is compared with what concatenating along the batch,
forgetting the bias, all-reducing instead of all-gathering, returning the
rank's slice alone, or mixing up the order of the slices would give; a
missing gradient, one world_size times too large, and gathered weights are
named as such.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_teach.exercises.harness import run_learner_code
from ddp_teach.exercises.registry import (CORRECT, NOT_ATTEMPTED, WRONG, Exercise,
                                         Verdict, register)

WORLD_SIZES = (1, 2, 3, 4, 5)
BATCH, IN, OUT = 3, 5, 60  # OUT splits into 1 to 5 slices
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def _linear():
    torch.manual_seed(1)
    layer = nn.Linear(IN, OUT)
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(2))
    return layer, x


def _output_grad():
    """The gradient of the loss with respect to the output: the same on
    every rank, as one loss of one output is."""
    return torch.randn(BATCH, OUT, generator=torch.Generator().manual_seed(3))


def _column_on_ranks(rank, world_size, fn):
    from ddp_teach.tensor_parallel import shard
    layer, x = _linear()
    w = shard(layer.weight.detach(), 0, rank, world_size).requires_grad_()
    b = shard(layer.bias.detach(), 0, rank, world_size).requires_grad_()
    gathered, real = [], {name: getattr(dist, name) for name in GATHERS}

    def watched(name):
        def gather(*args, **kwargs):
            sent = args[1] if len(args) > 1 else kwargs.get(
                "tensor", kwargs.get("input_tensor"))
            if isinstance(sent, torch.Tensor):
                gathered.append(sent.detach().clone())
            return real[name](*args, **kwargs)
        return gather
    for name in GATHERS:
        setattr(dist, name, watched(name))
    try:
        out = fn(x.clone(), w, b)
        if isinstance(out, torch.Tensor) and out.requires_grad \
                and out.shape == (BATCH, OUT):
            (out * _output_grad()).sum().backward()
    except NotImplementedError:
        return NOT_ATTEMPTED
    finally:
        for name, gather in real.items():
            setattr(dist, name, gather)
    return dict(out=out.detach() if isinstance(out, torch.Tensor) else out,
                weight_grad=w.grad, bias_grad=b.grad,
                gathered_weights=any(_holds_weights(t, w) for t in gathered),
                gathered_numel=sum(t.numel() for t in gathered))


def _holds_weights(sent: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a gathered tensor is the weight shard in any shape (itself,
    transposed, flattened, as a copy): the same numbers, in any order."""
    if sent.numel() != weight.numel() or not sent.is_floating_point():
        return False
    return torch.equal(sent.flatten().float().sort().values,
                       weight.detach().flatten().float().sort().values)


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


def _gradient_hint(got, rank, world_size) -> str | None:
    """The mistake in the gradients that reached the shards, or None."""
    own_outputs = BATCH * OUT // world_size  # this rank's slice of the output
    if got["gathered_weights"] or got["gathered_numel"] > own_outputs:
        return ("the output is right, but the weights were gathered (or "
                f"more than the {own_outputs} numbers of this rank's output "
                "slice were handed to all-gather): every "
                "rank then holds the whole matrix, which tensor parallelism "
                "exists to split. Gather the outputs: each rank computes its "
                "own features from its own weight_shard.")
    layer, x = _linear()
    grad_out = _output_grad().chunk(world_size, dim=-1)[rank]
    want_w, want_b = grad_out.T @ x, grad_out.sum(0)
    w, b = got["weight_grad"], got["bias_grad"]
    if w is None or b is None:
        return ("the output is right, but backward through it never reaches "
                "weight_shard: dist.all_gather fills its list outside "
                "autograd, so your own slice lost its history. Put `local` "
                "itself into your rank's slot of the gathered list before "
                "concatenating.")
    if torch.allclose(w, want_w, atol=1e-5) and torch.allclose(b, want_b, atol=1e-5):
        return None
    if torch.allclose(w, world_size * want_w, atol=1e-5):
        return ("the gradient of weight_shard is world_size times too large. "
                "torch.distributed.nn.functional.all_gather's backward adds "
                "up every rank's copy of your slice's gradient; here every "
                "rank computes the same loss from the same output, so that "
                "counts it world_size times. Gather with dist.all_gather and "
                "put `local` itself into your rank's slot instead.")
    return ("the output is right, but weight_shard's gradient is not the one "
            "of its own output features: compute local from x and the shards, "
            "and put local itself (not a copy) into the gathered list.")


def check_column_parallel(fn) -> Verdict:
    for world_size in WORLD_SIZES:
        results, problem = run_learner_code(_column_on_ranks, world_size, fn)
        if problem:
            return problem
        for rank, got in enumerate(results):
            where = f"on {world_size} rank{'s' * (world_size > 1)}, rank {rank}: "
            hint = _column_hint(got["out"], world_size)
            if hint:
                out = got["out"]
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else "-"
                return Verdict(WRONG, where + f"expected the output of "
                               f"nn.Linear({IN}, {OUT}) on a batch of {BATCH}, "
                               f"shape ({BATCH}, {OUT}); got shape {shape}.\n"
                               f"Hint: {hint}")
            hint = _gradient_hint(got, rank, world_size)
            if hint:
                return Verdict(WRONG, where + hint)
    return Verdict(CORRECT, f"equal to nn.Linear({IN}, {OUT}) on 1 to 5 "
                            "ranks, on every rank, with each shard's gradient "
                            "that of its own output features, and only "
                            "outputs gathered.")


register(Exercise(
    "column_parallel_linear", "A column-parallel linear layer",
    "my_column_parallel_forward",
    "ddp_teach.tensor_parallel:column_parallel_forward", check_column_parallel,
    ["Each rank computes its slice of the outputs with no communication: "
     "local = F.linear(x, weight_shard, bias_shard).",
     "dist.all_gather(list_of_empty_like, local.detach()) collects every "
     "rank's slice, in rank order, outside autograd; put local itself back "
     "into your rank's slot, so that backward reaches your shards.",
     "torch.cat(the_list, dim=-1): the slices are output features, side "
     "by side."]))
