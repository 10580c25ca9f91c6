"""A Llama-style decoder, small enough to train on CPU ranks in seconds.

Notebook 08 trains it as a production trainer trains its large cousins:
built on the meta device, sharded per block with FSDP2, materialised per
rank and initialised by `init_weights`. The architecture is Llama's
(Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
2023; Grattafiori et al., "The Llama 3 Herd of Models", 2024):

- RMSNorm before each sublayer (Zhang and Sennrich, "Root Mean Square Layer
  Normalization", NeurIPS 2019): no mean, no bias;
- rotary position embeddings (Su et al., "RoFormer", 2021) on the queries
  and keys, no learned positions;
- grouped-query attention (Ainslie et al., 2023): `kv_heads` key and value
  heads shared by `heads` query heads; causal, through
  F.scaled_dot_product_attention;
- a SwiGLU feed-forward (Shazeer, "GLU Variants Improve Transformer", 2020):
  w2(silu(w1 x) * w3 x);
- no biases anywhere, and an output projection not tied to the embedding.

Why `init_weights` exists: a model built under `torch.device("meta")` has
shapes and no values; `to_empty` gives it memory but not values, and its
buffers (the rotary tables here) are garbage too. `init_weights` fills
every parameter from a generator seeded by `seed`, parameter by parameter
in a fixed order, each rank keeping the rows of its shard, so that every
rank's shard is the slice of the same full model that a model built
normally and initialised with the same seed holds. (TorchTitan's models,
pytorch/torchtitan, carry an `init_weights` for the same reason.)
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # GPT-2's and Llama's normal init for weights and embeddings


@dataclass(frozen=True)
class LlamaConfig:
    """The model's shape. `hidden` is the SwiGLU's inner width."""
    vocab: int = 96
    width: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 172
    context: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads "
                             f"{self.heads}: each head takes width / heads features")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads "
                             f"{self.kv_heads}: each key/value head serves "
                             f"heads / kv_heads query heads")
        if (self.width // self.heads) % 2:
            raise ValueError(f"the head width {self.width // self.heads} is odd: "
                             f"rotary embeddings turn pairs of features")

    @property
    def head_width(self) -> int:
        return self.width // self.heads


def llama3_8b() -> LlamaConfig:
    """Llama 3 8B's shape (the paper's Table 3): 32 layers of width 4,096,
    32 query and 8 key/value heads, a SwiGLU of 14,336, 128,256 tokens."""
    return LlamaConfig(vocab=128256, width=4096, layers=32, heads=32, kv_heads=8,
                       hidden=14336, context=8192, rope_theta=500000.0)


def parameter_count(config: LlamaConfig) -> int:
    """Parameters of `Llama(config)`, from the shape alone."""
    kv = config.kv_heads * config.head_width
    attention = 2 * config.width ** 2 + 2 * config.width * kv
    block = attention + 3 * config.width * config.hidden + 2 * config.width
    return config.layers * block + 2 * config.vocab * config.width + config.width


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 whatever x's dtype."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotary_tables(config: LlamaConfig, device=None) -> torch.Tensor:
    """(2, context, head_width / 2): cos and sin of each position's angle
    for each pair of features, the angles position * theta^(-2i / head_width)."""
    half = config.head_width // 2
    frequencies = config.rope_theta ** (-torch.arange(half, device=device,
                                                      dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.context, device=device,
                                      dtype=torch.float32), frequencies)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rotary(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Turn each pair of features (first half, second half) of x
    (batch, heads, length, head_width) by its position's angle, in fp32."""
    length = x.shape[-2]
    cos, sin = tables[0, :length].to(torch.float32), tables[1, :length].to(torch.float32)
    first, second = x.float().chunk(2, dim=-1)
    turned = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return turned.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        kv = config.kv_heads * config.head_width
        self.wq = nn.Linear(config.width, config.width, bias=False)
        self.wk = nn.Linear(config.width, kv, bias=False)
        self.wv = nn.Linear(config.width, kv, bias=False)
        self.wo = nn.Linear(config.width, config.width, bias=False)

    def forward(self, x, tables):
        c = self.config
        batch, length, _ = x.shape

        def heads(t, count):
            return t.view(batch, length, count, c.head_width).transpose(1, 2)
        q = apply_rotary(heads(self.wq(x), c.heads), tables)
        k = apply_rotary(heads(self.wk(x), c.kv_heads), tables)
        v = heads(self.wv(x), c.kv_heads)
        share = c.heads // c.kv_heads  # query heads per key/value head
        k, v = k.repeat_interleave(share, dim=1), v.repeat_interleave(share, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, length, c.width))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.width, config.hidden, bias=False)
        self.w3 = nn.Linear(config.width, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.width, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """x + attention(norm(x)), then + feed_forward(norm(x)): FSDP's unit,
    and the unit of activation checkpointing and of torch.compile."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.width, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.width, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, tables):
        x = x + self.attention(self.attention_norm(x), tables)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Embedding, `layers` blocks, a final RMSNorm, the output projection.

    `forward(tokens)` gives logits (batch, length, vocab). The rotary
    tables are a buffer that no checkpoint holds (persistent=False): they
    follow from the config, and `init_weights` recomputes them."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.width)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.norm_eps)
        self.output = nn.Linear(config.width, config.vocab, bias=False)
        self.register_buffer("rotary", rotary_tables(config), persistent=False)

    def forward(self, tokens):
        if tokens.shape[-1] > self.config.context:
            raise ValueError(f"{tokens.shape[-1]} tokens, more than the model's "
                             f"context of {self.config.context}")
        x = self.tok_embeddings(tokens)
        for block in self.layers:
            x = block(x, self.rotary)
        return self.output(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Every parameter from one generator seeded by `seed`, in the order
        of named_parameters: norms 1, the rest normal(0, INIT_STD), wo and w2
        scaled by 1/sqrt(2 layers) as GPT-2 does for the projections into the
        residual stream. A sharded parameter (a DTensor) keeps its own rows
        of the full tensor, so every rank ends with its slice of the same
        model. Also recomputes the rotary tables (garbage after to_empty)."""
        generator = torch.Generator().manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.config.layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                full = torch.ones(param.shape)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
                full = torch.randn(param.shape, generator=generator) * std
            _fill(param, full)
        self.rotary.copy_(rotary_tables(self.config, device=self.rotary.device))


def _fill(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy `full` into `param`; a DTensor takes the piece its placements
    give this rank (distribute_tensor with src_data_rank=None: each rank
    cuts its own piece, nothing is sent)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    if isinstance(param, DTensor):
        piece = distribute_tensor(full.to(param.dtype), param.device_mesh,
                                  param.placements, src_data_rank=None)
        param.to_local().copy_(piece.to_local())
    else:
        param.copy_(full.to(param.dtype))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's prediction, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
