"""Notebook 09's ring attention: planted mistakes (PLANTED, run by
test_registry.py, which also checks the reference and a stub), each of
which must get the hint that fits, and right answers in other styles that
must pass: isend / irecv instead of a batch with K and V in one message,
and a two-pass merge that keeps every chunk's partial result and combines
them once with their log-sum-exps."""
import math

import torch
import torch.distributed as dist

from ddp_teach.exercises.nb09_ring_attention_cases import (CASES, expected_attention,
                                                           make_inputs, mistakes)


def _ring_steps(k, v, send_to, receive_from, wait=True):
    """The K/V chunks this rank sees, its own first, passed around a ring
    with batch_isend_irecv."""
    rank, p = dist.get_rank(), dist.get_world_size()
    k, v = k.contiguous(), v.contiguous()
    for step in range(p):
        yield k, v
        if step == p - 1:
            return
        next_k, next_v = torch.empty_like(k), torch.empty_like(v)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, k, send_to(rank, p)),
            dist.P2POp(dist.isend, v, send_to(rank, p)),
            dist.P2POp(dist.irecv, next_k, receive_from(rank, p)),
            dist.P2POp(dist.irecv, next_v, receive_from(rank, p))])
        if wait:
            for work in works:
                work.wait()
        k, v = next_k, next_v


def _forward(rank, p):
    return (rank + 1) % p


def _backward(rank, p):
    return (rank - 1) % p


def _online(q, chunks, rescale=True, subtract_max=True):
    """The online softmax over `chunks`, with a mistake or two on demand."""
    scale = q.shape[-1] ** -0.5
    out = running_sum = 0
    running_max = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
    for k, v in chunks:
        scores = q @ k.transpose(-2, -1) * scale
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        if not subtract_max:
            new_max = torch.zeros_like(new_max)
        factor = torch.exp(running_max - new_max) if rescale else 1
        weights = torch.exp(scores - new_max)
        running_sum = running_sum * factor + weights.sum(-1, keepdim=True)
        out = out * factor + weights @ v
        running_max = new_max
    return out / running_sum


# ---- planted mistakes -----------------------------------------------------------

def no_rescale(q, k, v):
    return _online(q, _ring_steps(k, v, _forward, _backward), rescale=False)


def no_max_subtracted(q, k, v):
    return _online(q, _ring_steps(k, v, _forward, _backward), subtract_max=False)


def receives_from_the_wrong_side(q, k, v):
    """Sends to the right and receives from the right: on 3 ranks or more
    the messages never meet."""
    return _online(q, _ring_steps(k, v, _forward, _forward))


def never_waits(q, k, v):
    return _online(q, _ring_steps(k, v, _forward, _backward, wait=False))


def waits_on_receives_only(q, k, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks, k, v = [], k.contiguous(), v.contiguous()
    for step in range(p):
        chunks.append((k, v))
        if step < p - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            dist.isend(k, (rank + 1) % p)
            dist.isend(v, (rank + 1) % p)
            received = [dist.irecv(next_k, (rank - 1) % p),
                        dist.irecv(next_v, (rank - 1) % p)]
            for work in received:
                work.wait()
            k, v = next_k, next_v
    return _online(q, chunks)


def own_chunk_only(q, k, v):
    return _online(q, [(k, v)])


def averages_the_chunks(q, k, v):
    outs = [_online(q, [chunk]) for chunk in _ring_steps(k, v, _forward, _backward)]
    return sum(outs) / len(outs)


def gathers_everything(q, k, v):
    p = dist.get_world_size()
    ks = [torch.empty_like(k) for _ in range(p)]
    vs = [torch.empty_like(v) for _ in range(p)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    return _online(q, [(torch.cat(ks, 2), torch.cat(vs, 2))])


def one_step_short(q, k, v):
    """Computes only with the chunks that arrived, never with its own."""
    return _online(q, list(_ring_steps(k, v, _forward, _backward))[1:] or [(k, v)])


def output_like_q(q, k, v):
    out = torch.zeros_like(q)
    result = _online(q, _ring_steps(k, v, _forward, _backward))
    out[..., :result.shape[-1]] = result
    return out


# ---- right answers in other styles ----------------------------------------------

def with_isend_irecv_and_one_message(q, k, v):
    """K and V travel together, one tensor, with isend / irecv."""
    rank, p = dist.get_rank(), dist.get_world_size()
    d = k.shape[-1]
    kv, chunks = torch.cat([k, v], -1).contiguous(), []
    for step in range(p):
        chunks.append((kv[..., :d], kv[..., d:]))
        if step < p - 1:
            incoming = torch.empty_like(kv)
            sent = dist.isend(kv, (rank + 1) % p)
            received = dist.irecv(incoming, (rank - 1) % p)
            sent.wait()
            received.wait()
            kv = incoming
    return _online(q, chunks)


def two_pass_merge(q, k, v):
    """Each chunk's attention and log-sum-exp kept, merged once at the end."""
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for k_j, v_j in _ring_steps(k, v, _forward, _backward):
        scores = q @ k_j.transpose(-2, -1) * scale
        lses.append(torch.logsumexp(scores, -1, keepdim=True))
        outs.append(torch.softmax(scores, -1) @ v_j)
    total = torch.logsumexp(torch.cat(lses, -1), -1, keepdim=True)
    return sum(torch.exp(lse - total) * out for lse, out in zip(lses, outs))


def test_ring_attention_in_other_styles_passes(verdict):
    for right in (with_isend_irecv_and_one_message, two_pass_merge):
        passed, seen = verdict("ring_attention", right)
        assert passed, seen


def test_the_expected_value_is_torchs_attention_and_the_mistakes_differ_from_it():
    """The checker's yardstick is softmax(q k^T / sqrt(d)) v written out,
    and every modelled mistake is far from it, so that no hint can fire on
    a right answer."""
    case = CASES[0]
    for world_size in (1, 3):
        for rank in range(world_size):
            (q, _, _), (_, k, v) = make_inputs(rank, world_size, case)
            q, k, v = q.double(), k.double(), v.double()
            by_hand = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]),
                                    -1) @ v
            want = expected_attention(rank, world_size, case)
            assert torch.allclose(want, by_hand, atol=1e-12)
            for wrong, _ in mistakes(rank, world_size, case)[world_size == 1:]:
                assert (wrong - want).abs().max() > 1e-3


PLANTED = [  # (exercise, planted mistake, the hint it must get): see test_registry
    ("ring_attention", no_rescale, "rescale both by exp(old_max - new_max)"),
    ("ring_attention", no_max_subtracted, "Subtract the running maximum"),
    ("ring_attention", receives_from_the_wrong_side, ("never met", "(rank - 1) % p")),
    ("ring_attention", never_waits, "read before its wait()"),
    ("ring_attention", waits_on_receives_only, "never waited on"),
    ("ring_attention", own_chunk_only, "own chunk only"),
    ("ring_attention", averages_the_chunks, "weights every chunk alike"),
    ("ring_attention", gathers_everything, "dist.all_gather"),
    ("ring_attention", one_step_short, "one chunk of K/V is never used"),
    ("ring_attention", output_like_q, "V's head dim"),
]
