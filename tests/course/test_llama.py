"""The Llama-style model of notebook 08 (ddp_teach/llama.py) and the
pieces of the real job around it (ddp_teach/real_job.py)."""
import pytest
import torch

import ddp_teach as dt
from ddp_teach.llama import (Llama, LlamaConfig, apply_rotary, llama3_8b,
                             next_token_loss, parameter_count, rotary_tables)

SMALL = LlamaConfig(vocab=50, width=32, layers=2, heads=4, kv_heads=2, hidden=48,
                    context=12)


def built(seed=0, config=SMALL):
    model = Llama(config)
    model.init_weights(seed)
    return model


def test_bad_shapes_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="not a multiple of heads"):
        LlamaConfig(width=30, heads=4)
    with pytest.raises(ValueError, match="not a multiple of kv_heads"):
        LlamaConfig(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="odd"):
        LlamaConfig(width=12, heads=4, kv_heads=2)


def test_the_parameter_count_is_the_models_and_llama3_8b_has_8_billion():
    assert parameter_count(SMALL) == sum(p.numel() for p in Llama(SMALL).parameters())
    with torch.device("meta"):
        big = Llama(llama3_8b())
    assert parameter_count(llama3_8b()) == sum(p.numel() for p in big.parameters())
    assert round(parameter_count(llama3_8b()) / 1e9, 2) == 8.03  # the paper's "8B"


def test_init_weights_is_the_same_for_the_same_seed_and_norms_start_at_one():
    a, b, c = built(0), built(0), built(1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if name.endswith("norm.weight"):
            assert torch.equal(pa, torch.ones_like(pa)), name
        else:
            assert not torch.equal(pa, pc), name


def test_a_model_built_on_meta_is_the_normal_one_after_to_empty_and_init_weights():
    with torch.device("meta"):
        model = Llama(SMALL)
    model.to_empty(device="cpu")
    model.init_weights(0)
    normal = built(0)
    assert torch.equal(model.rotary, normal.rotary)   # a buffer: recomputed
    for a, b in zip(model.parameters(), normal.parameters()):
        assert torch.equal(a, b)


def test_attention_is_causal():
    model = built()
    tokens = torch.randint(0, SMALL.vocab, (2, SMALL.context),
                           generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % SMALL.vocab
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_rotary_scores_depend_on_the_offset_between_positions_only():
    tables = rotary_tables(LlamaConfig(width=16, heads=2, kv_heads=1, context=12))
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):  # q at position m against k at position n
        qs = apply_rotary(q.expand(1, 1, 12, 8).clone(), tables)[0, 0, m]
        ks = apply_rotary(k.expand(1, 1, 12, 8).clone(), tables)[0, 0, n]
        return (qs @ ks).item()
    assert score(5, 2) == pytest.approx(score(9, 6), rel=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_more_tokens_than_the_context_are_refused():
    with pytest.raises(ValueError, match="more than the model's context of 12"):
        built()(torch.zeros(1, 13, dtype=torch.long))


def test_the_loss_of_an_untrained_model_is_about_ln_vocab():
    tokens = torch.randint(0, SMALL.vocab, (4, SMALL.context + 1),
                           generator=torch.Generator().manual_seed(1))
    loss = next_token_loss(built()(tokens[:, :-1]), tokens[:, 1:]).item()
    assert abs(loss - torch.log(torch.tensor(50.0)).item()) < 0.1


def sharded_init(rank, world_size):
    from ddp_teach import real_job
    model = real_job.build_sharded(SMALL, seed=3)
    return [p.full_tensor() for p in model.parameters()], \
        sum(p.to_local().numel() for p in model.parameters())


def test_every_ranks_shard_is_its_slice_of_the_normally_built_model():
    runs = dt.run(sharded_init, 3, backend="gloo")
    normal = built(3)
    for full, _ in runs:
        for a, b in zip(full, normal.parameters()):
            assert torch.equal(a, b)
    # each rank holds the rows torch.chunk gives it, of every parameter
    chunks = [p.detach().chunk(3) for p in normal.parameters()]
    expected = [sum(c[rank].numel() for c in chunks if rank < len(c)) for rank in range(3)]
    assert [count for _, count in runs] == expected
    assert sum(expected) == parameter_count(SMALL)


def test_every_rank_draws_the_same_global_batch_and_takes_its_own_rows():
    from ddp_teach.real_job import GLOBAL_BATCH, global_batch, my_rows
    tokens = torch.arange(500)
    torch.manual_seed(5)
    x, y = global_batch(tokens, 16)
    torch.manual_seed(5)
    again, _ = global_batch(tokens, 16)
    assert torch.equal(x, again) and x.shape == (GLOBAL_BATCH, 16)
    assert torch.equal(y, x + 1)                 # targets: the next token
    for world_size in (1, 2, 3, 4):
        rows = [my_rows(x, rank, world_size) for rank in range(world_size)]
        assert torch.equal(torch.cat(rows), x)
        assert len({len(r) for r in rows}) == 1  # an even split


def resume_without_the_rng(rank, world_size, path):
    from ddp_teach import real_job

    def state_without_rng(model, optimizer, scheduler, step):
        state = real_job.step_checkpoint_state(model, optimizer, scheduler, step)
        del state["rng"]
        return state
    model = real_job.build_sharded(SMALL)
    optimizer, scheduler = real_job.new_optimizer_and_scheduler(model)
    try:
        real_job.resume(path, model, optimizer, scheduler, state_without_rng)
    except KeyError as error:
        return str(error)
    return "resumed"


def test_a_resume_names_the_keys_the_checkpoint_lacks(tmp_path):
    said = dt.run(resume_without_the_rng, 1, args=(str(tmp_path),), backend="gloo")[0]
    assert "the step checkpoint has no 'rng'" in said
    assert "['model', 'optimizer', 'scheduler', 'step']" in said


def collectives_of_one_step(rank, world_size):
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from ddp_teach import real_job
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = real_job.build_sharded(SMALL, mp_policy=policy)
    before = {name: getattr(dist, name) for name in dir(dist)}
    tokens = torch.randint(0, SMALL.vocab, (2, SMALL.context + 1),
                           generator=torch.Generator().manual_seed(rank))
    with real_job.collectives_seen() as seen:
        next_token_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    restored = all(getattr(dist, name) is function for name, function in before.items())
    return seen, restored


def test_collectives_seen_notes_every_gather_and_scatter_fsdp2_calls_and_restores_them():
    """Blocks are gathered in the forward and again in the backward, the
    root once; each unit's gradients are reduce-scattered once; under a bf16
    policy with fp32 reduction the gathers carry bf16 and the scatters fp32.
    Afterwards torch.distributed holds its own functions again."""
    for seen, restored in dt.run(collectives_of_one_step, 2, backend="gloo"):
        assert restored
        gathers = [dtype for name, dtype in seen if name == "all-gather"]
        scatters = [dtype for name, dtype in seen if name == "reduce-scatter"]
        assert gathers == [torch.bfloat16] * (2 * SMALL.layers + 1)
        assert scatters == [torch.float32] * (SMALL.layers + 1)
