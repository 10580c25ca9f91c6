"""The models of the published training runs that `sim_vs_published.py`
simulates, written with the operations their eager PyTorch code runs, so
that a simulated step pays for every kernel the real one launched.

- `Llama`: Llama 3 (Grattafiori et al., "The Llama 3 Herd of Models", 2024,
  Table 3: 8B = 32 layers, width 4,096, 32 query heads and 8 key/value
  heads of 128, feed-forward 14,336, vocabulary 128,256) in the shape of
  torchtitan's eager model (pytorch/torchtitan, torchtitan/models/llama3):
  RMSNorm computed in fp32, rotary embeddings as complex products, the
  key/value heads repeated for grouped-query attention, SwiGLU, an untied
  output layer.
- `Mpt`: MPT-7B and -13B (MosaicML llm-foundry), see `MptBlock`.
- `Bert`: BERT-large (Devlin et al., NAACL 2019: 24 layers, width 1,024, 16
  heads, feed-forward 4,096, vocabulary 30,522 padded to 30,528 as NVIDIA's
  DeepLearningExamples do), post-norm encoder layers and the masked-LM and
  next-sentence heads; the masked-LM head on the masked tokens only, as
  that repository's BertPreTrainingHeads does by default
  (`sequence_output_is_dense`, commit a9e2c1d).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, \
    create_selective_checkpoint_contexts


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


def rotary(x, angles):
    """x (B, L, H, d) turned by the complex `angles` (L, d / 2)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    turned = torch.view_as_real(pairs * angles[None, :, None, :]).flatten(3)
    return turned.type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, width, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.attention_norm, self.ffn_norm = RMSNorm(width), RMSNorm(width)
        self.wq = nn.Linear(width, width, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(width, width, bias=False)
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)

    def forward(self, x, angles):
        batch, length, width = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(batch, length, self.heads, self.head_dim)
        k = self.wk(h).view(batch, length, self.kv_heads, self.head_dim)
        v = self.wv(h).view(batch, length, self.kv_heads, self.head_dim)
        q, k = rotary(q, angles), rotary(k, angles)
        repeat = self.heads // self.kv_heads
        k, v = (t.unsqueeze(3).expand(-1, -1, -1, repeat, -1).reshape(
            batch, length, self.heads, self.head_dim) for t in (k, v))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(out.transpose(1, 2).reshape(batch, length, width))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def _keep_attention_and_every_other_product(context, op, *args, **kwargs):
    """torchtitan's "op" selective activation checkpointing policy
    (torchtitan/distributed/activation_checkpoint.py, `_get_custom_policy`):
    in each block, keep the outputs of attention and of the 1st, 3rd, 5th ...
    matrix product; recompute the other products and every elementwise
    operation in backward."""
    if op == torch.ops.aten.mm.default:
        context.mm_count = getattr(context, "mm_count", 0) + 1
        keep = context.mm_count % 2 == 1
    else:
        keep = op in ATTENTION_OPS
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


ATTENTION_OPS = {torch.ops.aten._scaled_dot_product_flash_attention.default,
                 torch.ops.aten._scaled_dot_product_efficient_attention.default,
                 torch.ops.aten._scaled_dot_product_cudnn_attention.default}


def selective_op_checkpointing():
    return create_selective_checkpoint_contexts(_keep_attention_and_every_other_product)


class Llama(nn.Module):
    def __init__(self, layers=32, width=4096, heads=32, kv_heads=8, hidden=14336,
                 vocab=128256, length=8192, selective_checkpointing=False):
        super().__init__()
        self.selective_checkpointing = selective_checkpointing
        self.embedding = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(LlamaBlock(width, heads, kv_heads, hidden)
                                    for _ in range(layers))
        self.norm = RMSNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)
        half = width // heads // 2
        freqs = 1.0 / 500000.0 ** (torch.arange(half).float() / half)
        self.register_buffer("angles", torch.polar(
            torch.ones(length, half), torch.outer(torch.arange(length).float(), freqs)),
            persistent=False)

    def forward(self, tokens):
        x = self.embedding(tokens)
        angles = self.angles[:tokens.shape[1]]
        for layer in self.layers:
            x = (checkpoint(layer, x, angles, use_reentrant=False,
                            context_fn=selective_op_checkpointing)
                 if self.selective_checkpointing else layer(x, angles))
        return self.output(self.norm(x))


def llama_loss(model, tokens):
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())


class BertLayer(nn.Module):
    """As NVIDIA's DeepLearningExamples computes it (PyTorch/LanguageModeling/
    BERT/modeling.py, BertSelfAttention, at commit a9e2c1d, the one that
    published the NGC 21.11 figures): query, key and value as three
    products, and attention written out, two batched products around a
    softmax and a dropout (that PyTorch had no fused attention;
    `F.scaled_dot_product_attention` came with torch 2.0)."""

    def __init__(self, width=1024, heads=16, hidden=4096):
        super().__init__()
        self.heads = heads
        self.query, self.key = nn.Linear(width, width), nn.Linear(width, width)
        self.value, self.out = nn.Linear(width, width), nn.Linear(width, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (layer(x).view(batch, length, self.heads, -1).transpose(1, 2)
                   for layer in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        a = F.dropout(torch.softmax(scores, dim=-1), 0.1) @ v
        a = a.transpose(1, 2).reshape(batch, length, width)
        x = self.norm1(x + F.dropout(self.out(a), 0.1))
        return self.norm2(x + F.dropout(self.down(F.gelu(self.up(x))), 0.1))


class Bert(nn.Module):
    def __init__(self, layers=24, width=1024, vocab=30528, length=512):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.types, self.norm = nn.Embedding(2, width), nn.LayerNorm(width)
        self.layers = nn.Sequential(*[BertLayer(width) for _ in range(layers)])
        self.transform, self.head_norm = nn.Linear(width, width), nn.LayerNorm(width)
        self.decoder = nn.Linear(width, vocab)
        self.pooler, self.next_sentence = nn.Linear(width, width), nn.Linear(width, 2)

    def forward(self, tokens, masked):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.words(tokens) + self.positions(positions) + self.types(tokens * 0)
        x = self.layers(F.dropout(self.norm(x), 0.1))
        picked = x.flatten(0, 1).index_select(0, masked)
        scores = self.decoder(self.head_norm(F.gelu(self.transform(picked))))
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return scores, self.next_sentence(pooled)


def bert_loss(model, tokens, masked):
    scores, sentence = model(tokens, masked)
    return (F.cross_entropy(scores.float(), tokens.flatten().index_select(0, masked))
            + F.cross_entropy(sentence.float(), tokens[:, 0] * 0))


class MptBlock(nn.Module):
    """MPT (MosaicML, "MPT-7B", 2023; llm-foundry's mpt-7b.yaml: width 4,096,
    32 heads, 32 layers, feed-forward 4 x width with GELU, no biases,
    vocabulary 50,368, 2,048 tokens): pre-norm blocks, flash attention."""

    def __init__(self, width=4096, heads=32):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, bias=False), nn.LayerNorm(width, bias=False)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(width, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Mpt(nn.Module):
    def __init__(self, layers=32, width=4096, heads=32, vocab=50368):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(MptBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=False)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm(x), self.embedding.weight)  # tied


def mpt_loss(model, tokens):
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
