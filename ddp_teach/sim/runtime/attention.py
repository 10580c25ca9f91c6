"""`F.scaled_dot_product_attention` charged as the fused kernel a GPU runs.

On a GPU, torch runs scaled_dot_product_attention as one fused kernel
(FlashAttention: Dao et al., NeurIPS 2022; FlashAttention-2, 2023) that
never writes the L x L score matrix to memory. On the CPU, and on the meta
device above all, torch may pick its "math" path instead: a product, a
softmax and another product, in fp32, over the full score matrix, which a
per-operation charge would bill as if a GPU did the same. So while a
simulated function runs, `torch.nn.functional.scaled_dot_product_attention`
is replaced by a stand-in that lets the CPU or meta device compute it
uncharged, and charges one fused forward kernel, and in backward one fused
backward kernel (`charges.attention_seconds`): the same charge whatever the
device ran. (A stand-in rather than a `TorchFunctionMode`: a mode sees
every torch call, and doubled the wall time of a simulated step.) Calls
from other threads, and code that kept its own reference to the function,
are not caught.

Backward recomputes the forward, uncharged, under the RNG state of the
forward (so dropout draws the same mask) and differentiates it, which gives
the gradients torch's own backward gives. The output and the gradients
are laid out in memory as a GPU's flash kernels lay them out (the output
(B, L, H, d) in memory, seen as (B, H, L, d); each gradient like its
input), whatever path the CPU took, so that the operations after them
(a reshape that must copy, or not) are charged the same on every device.
"""
import contextlib
import functools
import threading

import torch
import torch.nn.functional as F

from ddp_teach.sim.runtime.charges import attention_seconds

OPTIONS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@contextlib.contextmanager
def fused_attention(recorder):
    """Inside: this thread's scaled_dot_product_attention calls are charged
    to `recorder` as one fused kernel forward and one backward."""
    original = F.scaled_dot_product_attention
    thread = threading.get_ident()

    @functools.wraps(original)
    def charged(query, key, value, *rest, **kwargs):
        if threading.get_ident() != thread or not recorder.charging:
            return original(query, key, value, *rest, **kwargs)
        options = {**dict(zip(OPTIONS, rest)), **kwargs}
        return _Fused.apply(recorder, options, query, key, value)

    F.scaled_dot_product_attention = charged
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, recorder, options, query, key, value):
        ctx.recorder, ctx.options = recorder, options
        ctx.rng = torch.get_rng_state()
        with _uncharged(recorder):
            out = _gpu_layout(F.scaled_dot_product_attention(query, key, value,
                                                             **options))
        recorder.kernel(attention_seconds(recorder.simulation, query, key, value,
                                          bool(options.get("is_causal")), False))
        ctx.save_for_backward(query, key, value)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value = ctx.saved_tensors
        needed = ctx.needs_input_grad[2:]
        recorder = ctx.recorder
        with _uncharged(recorder), torch.enable_grad(), \
                torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)
            leaves = [t.detach().requires_grad_(need)
                      for t, need in zip((query, key, value), needed)]
            out = F.scaled_dot_product_attention(*leaves, **ctx.options)
            wanted = [leaf for leaf, need in zip(leaves, needed) if need]
            grads = iter([_strided_like(grad, leaf) for grad, leaf in
                          zip(torch.autograd.grad(out, wanted, grad_out), wanted)])
        recorder.kernel(attention_seconds(recorder.simulation, query, key, value,
                                          bool(ctx.options.get("is_causal")), True))
        return (None, None, *(next(grads) if need else None for need in needed))


def _gpu_layout(out: torch.Tensor) -> torch.Tensor:
    """`out` (B, H, L, d) stored as (B, L, H, d), as flash attention does."""
    if out.dim() != 4:
        return out.contiguous()
    stored = out.new_empty(out.shape[0], out.shape[2], out.shape[1], out.shape[3])
    return stored.transpose(1, 2).copy_(out)


def _strided_like(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`grad` in the memory layout of `like`."""
    if grad.stride() == like.stride():
        return grad
    return grad.new_empty_strided(like.shape, like.stride()).copy_(grad)


@contextlib.contextmanager
def _uncharged(recorder):
    """The recorder charges nothing inside: what the CPU does here is not
    what the simulated GPU does."""
    before, recorder.charging = recorder.charging, False
    try:
        yield
    finally:
        recorder.charging = before
