"""Tests for ddp_teach.lm: the capstone's corpus, batches, model and sampler.

The notebook asserts that DDP, ZeRO-3 and a resumed run follow the one-process
loss curve; those checks mean something only if the pieces here are
deterministic (the corpus, the batches of a step, the initial weights) and
the model is a real causal language model (shapes, a loss that starts at
ln(vocab), no peeking at later tokens, and it can learn).
"""
import math

import pytest
import torch

from ddp_teach import lm

TEXT = "def add(a, b):\n    return a + b\n" * 20


def small_model(vocab_size, seed=0):
    return lm.TinyGPT(vocab_size, context=16, width=32, layers=2, heads=4,
                      seed=seed)


def test_the_corpus_is_the_same_text_every_time_and_nothing_else():
    first, second = lm.stdlib_corpus(), lm.stdlib_corpus()
    assert first == second and len(first) > 100_000
    assert "def " in first and "import " in first
    assert lm.stdlib_corpus(max_chars=1000) == first[:1000]
    reordered = lm.stdlib_corpus(files=tuple(reversed(lm.STDLIB_FILES)))
    assert sorted(reordered) == sorted(first) and reordered != first
    assert list(lm.STDLIB_FILES) == sorted(lm.STDLIB_FILES)


def test_the_vocabulary_is_the_sorted_characters_and_round_trips():
    vocab = lm.CharVocab.from_text(TEXT)
    assert vocab.chars == "".join(sorted(set(TEXT))) and vocab.size == len(set(TEXT))
    tokens = vocab.encode(TEXT)
    assert tokens.dtype == torch.long and tokens.shape == (len(TEXT),)
    assert int(tokens.max()) == vocab.size - 1 and vocab.decode(tokens) == TEXT
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.encode("def ü")


def test_unigram_entropy_is_zero_for_one_symbol_and_ln_k_for_k_equal_ones():
    assert lm.unigram_entropy(torch.zeros(50, dtype=torch.long), 5) == 0.0
    uniform = torch.arange(4).repeat(25)
    assert lm.unigram_entropy(uniform, 10) == pytest.approx(math.log(4))
    skewed = torch.tensor([0] * 90 + [1] * 10)
    assert 0 < lm.unigram_entropy(skewed, 2) < math.log(2)


def test_a_steps_batch_depends_only_on_the_step_and_the_seed():
    tokens = torch.arange(1000)
    x, y = lm.batch_for_step(tokens, 7, batch_size=6, context=12)
    again_x, again_y = lm.batch_for_step(tokens, 7, batch_size=6, context=12)
    assert x.shape == y.shape == (6, 12)
    assert torch.equal(x, again_x) and torch.equal(y, again_y)
    assert torch.equal(y, x + 1)  # targets: the next token of each input
    assert not torch.equal(x, lm.batch_for_step(tokens, 8, 6, 12)[0])
    assert not torch.equal(x, lm.batch_for_step(tokens, 7, 6, 12, seed=1)[0])
    assert int(y.max()) <= 999  # no window runs off the end


def test_the_model_gives_one_logit_per_vocabulary_entry_per_position():
    model = small_model(vocab_size=11)
    for length in (16, 5):
        logits = model(torch.randint(11, (3, length)))
        assert logits.shape == (3, length, 11)
    assert lm.count_parameters(model) == sum(p.numel() for p in model.parameters())
    assert len(model.blocks) == 2


def test_the_same_seed_builds_the_same_weights():
    a, b, c = small_model(11, seed=3), small_model(11, seed=3), small_model(11, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.head.weight, c.head.weight)


def test_an_untrained_model_scores_about_ln_vocab():
    vocab_size = 97
    model = small_model(vocab_size)
    tokens = torch.randint(vocab_size, (5000,), generator=torch.Generator().manual_seed(0))
    x, y = lm.batch_for_step(tokens, 0, batch_size=32, context=16)
    loss = lm.next_token_loss(model(x), y)
    assert abs(loss.item() - math.log(vocab_size)) < 0.05


def test_a_position_never_sees_the_tokens_after_it():
    model = small_model(11)
    tokens = torch.randint(11, (1, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 11
    before, after = model(tokens), model(changed)
    assert torch.equal(before[0, :10], after[0, :10])
    assert not torch.allclose(before[0, 10:], after[0, 10:])


def test_the_loss_is_fp32_even_from_bf16_logits():
    logits = torch.randn(2, 3, 5).bfloat16()
    loss = lm.next_token_loss(logits, torch.zeros(2, 3, dtype=torch.long))
    assert loss.dtype == torch.float32


def test_a_few_steps_of_training_beat_the_unigram_entropy():
    vocab = lm.CharVocab.from_text(TEXT)
    tokens = vocab.encode(TEXT)
    model = small_model(vocab.size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(40):
        x, y = lm.batch_for_step(tokens, step, batch_size=16, context=16)
        loss = lm.next_token_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < lm.unigram_entropy(tokens, vocab.size) / 2


def test_generation_is_reproducible_with_a_seed_and_varies_without():
    vocab = lm.CharVocab.from_text(TEXT)
    model = small_model(vocab.size)
    prompt = vocab.encode("def ")
    first = lm.generate(model, prompt, 40, seed=5)
    assert first.shape == (44,) and torch.equal(first[:4], prompt)
    assert torch.equal(first, lm.generate(model, prompt, 40, seed=5))
    assert not torch.equal(first, lm.generate(model, prompt, 40, seed=6))
    long_prompt = vocab.encode(TEXT[:50])  # longer than the context of 16
    assert lm.generate(model, long_prompt, 3).shape == (53,)
    with pytest.raises(ValueError, match="temperature"):
        lm.generate(model, prompt, 1, temperature=0)
