"""A small character-level transformer language model, and its corpus.

The capstone (notebook 11) trains one real model with everything the course
built: one process, DDP, bf16, ZeRO-3, accumulation, checkpoints, torchrun.
This module holds the parts that are not about distribution, so that the
notebook can show only what changes from one way of training to the next:

- the corpus: the source files of Python's own standard library, which
  every machine that runs the course already has, so nothing is downloaded
  (`stdlib_corpus`), cut into characters (`CharVocab`);
- the batches: windows of the text at places that depend only on the step
  number and a seed (`batch_for_step`), so a resumed run, or several ranks
  that each take a share, see exactly the batches one process would;
- the model (`TinyGPT`): a decoder-only transformer as in "Attention Is All
  You Need" (Vaswani et al., NeurIPS 2017) with its encoder and cross-
  attention removed, as in GPT (Radford et al., "Improving Language
  Understanding by Generative Pre-Training", 2018), and with the layer
  norms before each sublayer, as GPT-2 places them (Radford et al.,
  "Language Models are Unsupervised Multitask Learners", 2019);
- the yardsticks: the loss of an untrained model (ln of the vocabulary
  size) and of the best model that ignores context (`unigram_entropy`);
  and `generate`, to read what the model learnt.
"""
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# Modules that every Python from 3.10 on ships, in sorted order: the same
# selection on every machine. Their text can differ a little between Python
# versions, never between two runs on one machine.
STDLIB_FILES = ("abc.py", "bisect.py", "colorsys.py", "contextlib.py",
                "copy.py", "fnmatch.py", "functools.py", "heapq.py",
                "keyword.py", "queue.py", "random.py",
                "string.py", "textwrap.py", "weakref.py")


def stdlib_corpus(files=STDLIB_FILES, max_chars=None) -> str:
    """The named files of the standard library (the folder `os` was loaded
    from), joined in the order given; the first `max_chars` characters.

    Real text with a lot of structure (indentation, keywords, names that
    repeat), on every machine, without a download."""
    folder = Path(os.__file__).parent
    text = "\n".join((folder / name).read_text(encoding="utf-8")
                     for name in files)
    return text if max_chars is None else text[:max_chars]


@dataclass(frozen=True)
class CharVocab:
    """One token per distinct character of a text, in sorted order.

    Characters rather than words or byte-pair merges keep the vocabulary
    small (about a hundred symbols for Python source) and the tokenizer
    readable; the model then has to learn spelling as well as syntax."""
    chars: str

    @classmethod
    def from_text(cls, text: str) -> "CharVocab":
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """The text as a 1-D int64 tensor of token ids."""
        index = {char: i for i, char in enumerate(self.chars)}
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown[:10]}")
        return torch.tensor([index[char] for char in text], dtype=torch.long)

    def decode(self, tokens) -> str:
        return "".join(self.chars[int(t)] for t in tokens)


def unigram_entropy(tokens: torch.Tensor, vocab_size: int) -> float:
    """The entropy, in nats, of the tokens' frequencies: the cross-entropy
    loss of the best model that predicts every token without looking at
    the ones before it. A model whose loss is below it uses context."""
    counts = torch.bincount(tokens, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def batch_for_step(tokens: torch.Tensor, step: int, batch_size: int,
                   context: int, seed: int = 0):
    """(inputs, targets), each (batch_size, context): random windows of
    `tokens`, the targets one character further on.

    Where the windows start depends only on (seed, step): a run restarted
    from a checkpoint at step s draws the batches it would have drawn, and
    every rank can draw the same global batch and keep its own rows."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(len(tokens) - context, (batch_size,), generator=g)
    offsets = torch.arange(context)
    windows = tokens[starts[:, None] + offsets]
    targets = tokens[starts[:, None] + offsets + 1]
    return windows, targets


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting each next token, in nats, in fp32
    whatever dtype the logits are (a bf16 softmax over the vocabulary loses
    digits that the loss curve needs)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class CausalSelfAttention(nn.Module):
    """Multi-head attention in which position t sees positions 0..t only.

    One Linear makes queries, keys and values for all heads at once;
    torch's `scaled_dot_product_attention` does softmax(QK^T / sqrt(d)) V
    with the causal mask (Vaswani et al., section 3.2)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads)
                   .transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, time, width))


class Block(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x)): the norms before each
    sublayer (GPT-2's order) keep a deep stack trainable without warm-up."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and a
    linear head to one logit per vocabulary entry.

    Each block is a direct child in `blocks`, the natural unit for ZeRO-3 /
    FSDP to gather and free one at a time. The head is not tied to the token
    embedding, so that no parameter is shared between two units."""

    def __init__(self, vocab_size: int, context: int = 64, width: int = 64,
                 layers: int = 2, heads: int = 4, seed: int = 0):
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Weights ~ N(0, 0.02), biases 0, norms 1 (GPT-2's initialisation),
        from `seed` alone: every rank builds the same model. Small weights
        make an untrained model's logits nearly equal, so its loss starts
        near ln(vocab_size), the loss of a uniform guess."""
        g = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.02)
            if isinstance(module, nn.Linear):
                module.bias.zero_()

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))


def count_parameters(model: nn.Module) -> int:
    """Psi of notebook 06: how many numbers the parameters hold. With AdamW
    in fp32, DDP keeps 16 bytes per number on every rank."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int,
             seed: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """`prompt` (1-D token ids) followed by `new_tokens` sampled one at a
    time from the model's next-token distribution, each step seeing the
    last `model.context` tokens. The same seed gives the same text."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be > 0; got {temperature!r}")
    g = torch.Generator().manual_seed(seed)
    tokens = prompt.clone()
    for _ in range(new_tokens):
        logits = model(tokens[-model.context:][None])[0, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=g)])
    return tokens
