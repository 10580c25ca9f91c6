"""Tests for ddp_teach.fsdp: ZeRO-3, FullyShardedDataParallel from scratch.

Training must match torch's DDP; the gathered full parameters must be gone
after every forward and backward; communication must be the paper's 3 Psi
per step, 1.5x plain data parallelism.
"""
import gc
import time
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.fsdp import FullyShardedDataParallel
from ddp_teach.zero import paper_comm_volume, shard_size

RUN_TIMEOUT = 60.0
STEPS, IN, HIDDEN, OUT = 5, 4, 6, 3
ADAMW = dict(lr=0.05, weight_decay=0.1)


class Net(nn.Module):
    """Units by default: embed, blocks (holding a tied weight), head, and
    the root unit for `scale`, a parameter of the root itself."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(IN, HIDDEN)
        self.blocks = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                    nn.Linear(HIDDEN, HIDDEN))
        self.blocks[2].weight = self.blocks[0].weight  # tied inside one unit
        self.head = nn.Linear(HIDDEN, OUT)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, OUT))
        self.register_buffer("shift", torch.linspace(-1, 1, HIDDEN))

    def forward(self, x):
        h = torch.tanh(self.embed(x)) + self.shift
        return self.head(torch.tanh(self.blocks(h))) * self.scale


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, IN, generator=g), torch.randn(5, OUT, generator=g)


def train(model, optimizer, rank):
    for step in range(STEPS):
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


# ---- bad arguments, in this process (checked before any collective) ---------

@pytest.mark.parametrize("units, message", [
    (["nope"], "'nope' is not a submodule name"),
    ([""], "'' is not a submodule name"),
    (["blocks.1"], "'blocks.1' has no parameters"),
    (["blocks", "blocks.0"], "nested units are not supported"),
    (["blocks.0", "blocks.2"], "shared by units"),
])
def test_bad_units_are_refused_with_a_message_that_says_why(units, message):
    with pytest.raises(ValueError, match=message):
        FullyShardedDataParallel(make_net(), units=units)


def test_a_unit_mixing_frozen_and_trainable_parameters_is_refused():
    net = make_net()
    net.head.bias.requires_grad_(False)
    with pytest.raises(ValueError, match="unit head mixes frozen and trainable"):
        FullyShardedDataParallel(net)


# ---- training matches torch's DDP -------------------------------------------

def linear_or_sequential(_name, module):
    """A policy: blocks.0 is a Linear, but blocks (outermost) wins."""
    return isinstance(module, (nn.Linear, nn.Sequential))


def equivalence_worker(rank, world_size):
    out = {}
    ddp = nn.parallel.DistributedDataParallel(make_net())
    train(ddp, torch.optim.AdamW(ddp.parameters(), **ADAMW), rank)
    out["ddp"] = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    out["fsdp"] = {}
    for name, kwargs in {"default": {}, "no prefetch": dict(prefetch=False),
                         "units=['blocks']": dict(units=["blocks"]),
                         "policy": dict(units=linear_or_sequential),
                         "SGD": {}}.items():
        fsdp = FullyShardedDataParallel(make_net(seed=rank), **kwargs)
        if name == "default":
            out["shards"] = {n: p.numel() for n, p in fsdp.named_parameters()}
        optimizer = (torch.optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
                     if name == "SGD" else
                     torch.optim.AdamW(fsdp.parameters(), **ADAMW))
        train(fsdp, optimizer, rank)
        out["fsdp"][name] = fsdp.gather_full_params()
        out[f"units {name}"] = [unit.name for unit in fsdp.units]
    sgd = nn.parallel.DistributedDataParallel(make_net())
    train(sgd, torch.optim.SGD(sgd.parameters(), lr=0.1, momentum=0.9), rank)
    out["ddp SGD"] = {n: p.detach().clone() for n, p in sgd.module.named_parameters()}

    fresh = FullyShardedDataParallel(make_net(seed=rank))  # rank 0's values
    with torch.no_grad():  # evaluation: the same output as the plain module
        x, _ = batch(99, 0)
        out["eval"] = (fresh(x), make_net()(x), fresh.gathered_units())
    try:
        FullyShardedDataParallel(fsdp.module)
    except ValueError as err:
        out["rewrap"] = str(err)
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def trained(request):
    return request.param, dt.run(equivalence_worker, request.param,
                                 timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("variant", ["default", "no prefetch", "units=['blocks']",
                                     "policy", "SGD"])
def test_five_steps_match_torch_ddp(trained, variant):
    world_size, results = trained
    for rank, out in enumerate(results):
        want = out["ddp SGD"] if variant == "SGD" else out["ddp"]
        got = out["fsdp"][variant]
        assert list(got) == list(want)  # names and order of named_parameters()
        for name in want:
            torch.testing.assert_close(
                got[name], want[name], rtol=1e-5, atol=1e-6,
                msg=lambda m: f"world {world_size} rank {rank} {variant} {name}: {m}")


def test_each_rank_holds_one_padded_shard_per_unit(trained):
    world_size, results = trained
    numels = {"embed": 4 * 6 + 6, "blocks": 6 * 6 + 6 + 6, "head": 6 * 3 + 3,
              "(root)": 3}  # the tied weight is stored once
    for out in results:
        # in named_parameters() order: the root's own `scale` comes first
        assert out["units default"] == ["(root)", "embed", "blocks", "head"]
        assert out["units units=['blocks']"] == ["(root)", "blocks"]
        assert out["units policy"] == out["units default"]
        assert out["shards"] == {
            f"module.{'' if unit == '(root)' else unit + '.'}flat_param_shard":
            shard_size(numel, world_size) for unit, numel in numels.items()}


def test_evaluation_matches_the_plain_module_and_frees_everything(trained):
    _, results = trained
    for out in results:
        sharded, plain, still_gathered = out["eval"]
        torch.testing.assert_close(sharded, plain)
        assert still_gathered == []


def test_wrapping_twice_is_refused(trained):
    _, results = trained
    assert all("already wrapped" in out["rewrap"] for out in results)


# ---- the full parameters are freed ------------------------------------------

def alive(refs, settle_s=1.0) -> int:
    """How many of the weak references `refs` still reach a tensor, once
    gloo has let go: its worker thread drops its own reference to a
    collective's tensors a moment after the call returns, later on a loaded
    machine, so a buffer nobody else holds is given up to `settle_s`."""
    deadline = time.monotonic() + settle_s
    while True:
        gc.collect()
        count = sum(ref() is not None for ref in refs)
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def freeing_worker(rank, world_size, prefetch, keep_saved_tensors):
    """Weak references to every gathered buffer: which are still alive after
    forward and after backward? `keep_saved_tensors` switches the pack hook
    off, to show what it prevents."""
    fsdp = FullyShardedDataParallel(make_net(), prefetch=prefetch)
    if keep_saved_tensors:
        fsdp._pack = lambda tensor: tensor
    buffers = []
    all_gather = dist.all_gather_single

    def recording_all_gather(output, *args, **kwargs):
        buffers.append(weakref.ref(output))
        return all_gather(output, *args, **kwargs)

    dist.all_gather_single = recording_all_gather
    loss = fsdp(batch(0, rank)[0].requires_grad_()).square().sum()
    alive_after_forward = alive(buffers)
    gathered_in_forward = len(buffers)
    loss.backward()
    return dict(forward=(gathered_in_forward, alive_after_forward),
                backward=(len(buffers) - gathered_in_forward, alive(buffers)),
                units=fsdp.gathered_units(),
                grads=[p.grad is not None for p in fsdp.parameters()])


@pytest.mark.parametrize("prefetch", [True, False])
def test_no_full_parameters_survive_forward_or_backward(prefetch):
    for out in dt.run(freeing_worker, 2, args=(prefetch, False),
                      timeout=RUN_TIMEOUT):
        assert out["forward"] == (4, 0)   # 4 units gathered, none kept
        assert out["backward"] == (4, 0)  # all 4 gathered again, then freed
        assert out["units"] == []
        assert all(out["grads"])


def test_without_the_pack_hook_autograd_would_keep_them_alive():
    for out in dt.run(freeing_worker, 2, args=(True, True), timeout=RUN_TIMEOUT):
        assert out["forward"] == (4, 4)   # saved for backward: all kept
        assert out["backward"] == (0, 0)  # and so never gathered again


# ---- communication: 3 Psi per step, 1.5x plain data parallelism -------------

def traced_step_worker(rank, world_size, prefetch):
    fsdp = FullyShardedDataParallel(make_net(), prefetch=prefetch)
    ddp = dt.ddp.DistributedDataParallel(make_net())
    for model in (fsdp, ddp):
        x, y = batch(0, rank)
        nn.functional.mse_loss(model(x), y).backward()
    return sum(unit.shard.numel() for unit in fsdp.units) * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_zero3_communicates_1_5x_plain_dp_in_the_papers_convention(world_size):
    result = dt.run(traced_step_worker, world_size, args=(True,),
                    timeout=RUN_TIMEOUT, trace=True)
    psi = sum(p.numel() for p in make_net().parameters())  # 121, tied once
    padded_psi = result[0]
    for rank in range(world_size):
        events = result.timeline.for_rank(rank).events
        zero3 = paper_comm_volume([e for e in events if e.name.startswith("unit ")],
                                  world_size)
        ddp = paper_comm_volume([e for e in events if e.name.startswith("bucket")],
                                world_size)
        assert ddp == 2 * 4 * psi                  # one all-reduce of fp32 Psi
        assert zero3 == pytest.approx(3 * 4 * padded_psi)  # 2 gathers + 1 scatter
        assert zero3 / ddp == pytest.approx(1.5 * padded_psi / psi)
        assert zero3 / ddp == pytest.approx(1.5, rel=0.03)  # padding: < 3%


def test_prefetch_issues_the_next_gather_before_the_current_reduce_scatter():
    """Backward runs head, blocks, embed. With prefetch, the gather of the
    next unit is under way before the current one's reduce-scatter; without,
    each gather waits its turn, and embed (whose input needs no gradient)
    saved no weights, so it is never gathered again."""
    backward = {}
    for prefetch in (True, False):
        result = dt.run(traced_step_worker, 2, args=(prefetch,),
                        timeout=RUN_TIMEOUT, trace=True)
        names = [e.name for e in result.timeline.for_rank(0).events
                 if e.name.startswith("unit ")]
        backward[prefetch] = names[4:]  # after the forward's 4 all-gathers
    assert backward[True] == [
        "unit (root) all-gather", "unit head all-gather",
        "unit blocks all-gather", "unit head reduce-scatter",
        "unit embed all-gather", "unit blocks reduce-scatter",
        "unit embed reduce-scatter", "unit (root) reduce-scatter"]
    assert backward[False] == [
        "unit (root) all-gather", "unit head all-gather",
        "unit head reduce-scatter", "unit blocks all-gather",
        "unit blocks reduce-scatter", "unit embed reduce-scatter",
        "unit (root) reduce-scatter"]
