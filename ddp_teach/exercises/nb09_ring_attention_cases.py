"""The cases of notebook 09's ring attention checker (nb09_ring_attention.py),
the answer each should give, how far a right answer may be from it, and
what the usual mistakes give instead, so that the checker names the one
made.

Every rank builds the same whole sequence from one seed and keeps its own
chunk of the tokens; the expected value is torch's attention on the whole
sequence in float64, this rank's rows.
"""
import math

import torch
import torch.nn.functional as F

# (batch, heads, tokens per rank, q/k head dim, v head dim, dtype, score
# scale): the largest first (on a tiny case different mistakes look alike);
# V's head dim differs from Q's in the first; the last has scores in the
# hundreds, where exp overflows float32 unless the running maximum is
# subtracted
CASES = ((2, 3, 5, 8, 6, "float32", 1.0), (1, 1, 1, 4, 4, "float64", 1.0),
         (1, 2, 4, 8, 8, "float32", 60.0))
LARGE = CASES[-1]          # scores in the hundreds: exp overflows float32


def make_inputs(rank, world_size, case):
    """Rank `rank`'s chunk of q, k, v (the same whole sequence on every rank,
    cut along the tokens), and the whole k and v for the expected value."""
    batch, heads, tokens, d, d_v, dtype, scale = case
    g = torch.Generator().manual_seed(7)
    shape = (batch, heads, tokens * world_size)
    q = torch.randn(*shape, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(*shape, d, generator=g, dtype=torch.float64)
    v = torch.randn(*shape, d_v, generator=g, dtype=torch.float64)
    q, k, v = (t.to(getattr(torch, dtype)) for t in (q, k, v))
    return tuple(t.chunk(world_size, dim=2)[rank].clone() for t in (q, k, v)), (q, k, v)


def expected_attention(rank, world_size, case):
    """torch's attention on the whole sequence, in float64, this rank's rows."""
    _, (q, k, v) = make_inputs(rank, world_size, case)
    whole = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return whole.chunk(world_size, dim=2)[rank]


def tolerance(rank, world_size, case) -> float:
    """How far a right answer may be from the float64 one: each score is
    rounded to the dtype, off by eps x |score|, which exp turns into a
    relative error of the weights as large; the output, a weighted mean of
    V's rows, then moves by that times |V|, summed over the keys."""
    (q, _, _), (_, k, v) = make_inputs(rank, world_size, case)
    scores = (q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5
    eps = torch.finfo(getattr(torch, case[5])).eps
    return (eps * k.shape[2] * max(1.0, scores.abs().max().item())
            * max(1.0, v.abs().max().item()))


def _attention_over(q, k_chunks, v_chunks):
    scores = q @ torch.cat(k_chunks, 2).transpose(-2, -1) * q.shape[-1] ** -0.5
    return torch.softmax(scores, -1) @ torch.cat(v_chunks, 2)


def _without_rescale(q, k_chunks, v_chunks, order):
    """The online softmax with the rescale of what was accumulated forgotten."""
    scale = q.shape[-1] ** -0.5
    out, running_max, running_sum = 0, torch.full((*q.shape[:-1], 1), -math.inf,
                                                  dtype=q.dtype), 0
    for j in order:
        scores = q @ k_chunks[j].transpose(-2, -1) * scale
        running_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        weights = torch.exp(scores - running_max)
        running_sum = running_sum + weights.sum(-1, keepdim=True)
        out = out + weights @ v_chunks[j]
    return out / running_sum


def mistakes(rank, world_size, case):
    """(what the mistake gives, its hint), for the usual mistakes."""
    (q, _, _), (_, k, v) = make_inputs(rank, world_size, case)
    q, k, v = q.double(), k.double(), v.double()
    ks, vs = k.chunk(world_size, 2), v.chunk(world_size, 2)
    found = [(_attention_over(q, [ks[rank]], [vs[rank]]),
              "that is attention over this rank's own chunk only: the other "
              "ranks' K and V must come to you, one chunk per step, around "
              "the ring.")]
    if world_size > 1:
        found += [(_without_rescale(q, ks, vs, [(rank - s) % world_size for s in
                                               range(world_size)]),
                   "when the running maximum grows, what you accumulated so far "
                   "(the output and the sum of exps) was computed against the old "
                   "maximum: rescale both by exp(old_max - new_max) before adding "
                   "the new chunk's terms."),
                  (sum(_attention_over(q, [ks[j]], [vs[j]]) for j in range(world_size))
                   / world_size,
                   "averaging the chunks' softmax outputs weights every chunk "
                   "alike; weight each by its share of the total sum of exps "
                   "(keep a running maximum and sum, and rescale).")]
        found += [(_attention_over(q, [ks[j] for j in range(world_size) if j != left],
                                   [vs[j] for j in range(world_size) if j != left]),
                   "one chunk of K/V is never used: compute with the chunk in "
                   "hand at each of the p steps (your own first), passing it on "
                   "at the first p-1 of them.") for left in range(world_size)]
    return found
