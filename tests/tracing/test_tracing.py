"""What a traced run records: every collective (sync and async), spans,
torch DDP's buckets, and an emulated slow link."""
import time

import pytest
import torch
import torch.distributed as dist

import ddp_teach as dt
from ddp_teach.tracing.events import COMM, COMPUTE


class Link:  # what `network=` needs: alpha seconds, beta seconds per byte
    def __init__(self, alpha, beta):
        self.alpha, self.beta = alpha, beta


def every_kind_of_call(rank, world_size):
    t = torch.ones(256)  # 1 KiB of float32
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.empty(256) for _ in range(world_size)], t)
    dist.all_gather_into_tensor(torch.empty(256 * world_size), t)
    dist.reduce_scatter_tensor(torch.empty(128), torch.ones(128 * world_size))
    dist.all_to_all_single(torch.empty(256), t)
    dist.gather(t, [torch.empty(256) for _ in range(world_size)] if rank == 0
                else None, dst=0)
    dist.scatter(t, [torch.ones(256)] * world_size if rank == 0 else None, src=0)
    dist.barrier()
    peer = 1 - rank
    if rank == 0:
        dist.send(t, dst=peer)
        dist.irecv(t, src=peer).wait()
    else:
        dist.recv(t, src=peer)
        dist.isend(t, dst=peer).wait()
    ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, t.clone(), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    objects = [None] * world_size
    dist.all_gather_object(objects, {"rank": rank})
    with dt.span("my compute"):
        time.sleep(0.01)
    return objects


# the old names of torch before 2.13 read as 2.13's in a trace (compat.traced_name)
EXPECTED = {dt.compat.traced_name(name) for name in (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier",
    "batch_isend_irecv", "all_gather_object")}


def test_every_collective_sync_and_async_is_recorded_on_every_rank():
    result = dt.run(every_kind_of_call, 2, trace=True)
    timeline = result.timeline
    for rank, p2p in ((0, {"send", "irecv"}), (1, {"recv", "isend"})):
        events = timeline.for_rank(rank).events
        comm = [e for e in events if e.kind == COMM]
        assert {e.name for e in comm} == EXPECTED | p2p
        reduces = [e for e in comm if e.name == "all_reduce"]
        assert len(reduces) == 2 and all(e.nbytes == 1024 for e in reduces)
        assert all(e.end >= e.start for e in events)
        assert [e.name for e in events if e.kind == COMPUTE] == ["my compute"]
        # a batch of two 1 KiB ops: a work each, with its own op's bytes
        batch = [e.nbytes for e in comm if e.name == "batch_isend_irecv"]
        assert batch == [1024, 1024], batch
    # all_gather_object runs all_gather inside: recorded once, as itself
    assert sum(e.name == "all_gather" for e in timeline.for_rank(0).events) == 1


def test_async_completion_is_when_the_data_arrived_not_when_waited():
    def late_waiter(rank, world_size):
        t = torch.ones(4)
        if rank == 1:
            time.sleep(0.3)  # rank 0's all_reduce completes when rank 1 joins
        work = dist.all_reduce(t, async_op=True)
        if rank == 0:
            time.sleep(1.0)  # ... long before rank 0 waits for it
        work.wait()

    timeline = dt.run(late_waiter, 2, trace=True).timeline
    (event,) = [e for e in timeline.for_rank(0).events if e.kind == COMM]
    assert 0.25 < event.end - event.start < 0.8


def test_untraced_runs_have_no_timeline_and_spans_do_nothing_outside_runs():
    assert dt.run(lambda r, w: r, 2).timeline is None
    with dt.span("in the kernel"):  # no recorder here: a no-op
        pass

    @dt.span("decorated")
    def step():
        return 3

    assert step() == 3


def ddp_training(rank, world_size, hook=None, steps=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    torch.manual_seed(rank)
    for _ in range(steps):
        loss = ddp(torch.randn(8, 64)).square().mean()
        with dt.span("backward"):
            loss.backward()
    return [p.grad.clone() for p in ddp.parameters()]


def test_torch_ddp_buckets_are_recorded_and_gradients_are_unchanged():
    traced = dt.run(ddp_training, 2, trace=True)
    plain = dt.run(ddp_training, 2)
    for a, b in zip(traced[0], plain[0]):
        assert torch.allclose(a, b)  # the recorded hook averages like DDP's
    buckets = {e.name for e in traced.timeline.for_rank(0).events
               if e.name.startswith("ddp bucket")}
    assert len(buckets) > 1  # a 0.02 MB cap splits this model into buckets


def test_a_learners_own_ddp_hook_is_kept_and_still_recorded():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook)
    result = dt.run(ddp_training, 2, kwargs={"hook": allreduce_hook}, trace=True)
    names = {e.name for e in result.timeline.for_rank(0).events}
    assert "all_reduce" in names and not any(n.startswith("ddp") for n in names)


def test_emulated_link_makes_every_call_at_least_alpha_plus_bytes_beta():
    def calls(rank, world_size):
        t = torch.ones(1000)  # 4000 bytes
        dist.all_reduce(t)
        issued = time.perf_counter()
        dist.all_reduce(t, async_op=True).wait()
        return time.perf_counter() - issued

    link = Link(alpha=0.1, beta=25e-6)  # 0.1 s + 4000 * 25 us = 0.2 s
    result = dt.run(calls, 2, trace=True, network=link)
    assert all(waited >= 0.2 for waited in result)
    for event in result.timeline.filter(kind=COMM).events:
        assert event.end - event.start >= 0.2 - 1e-6
        assert 0 < event.emulated_s <= event.end - event.start


def test_emulated_link_slows_ddp_without_changing_its_gradients():
    link = dt.cost.Link(alpha=0.05, beta=0.0)  # the course's own Link works
    slow = dt.run(ddp_training, 2, network=link, trace=True)
    fast = dt.run(ddp_training, 2)
    for a, b in zip(slow[0], fast[0]):
        assert torch.allclose(a, b)
    buckets = [e for e in slow.timeline.for_rank(0).events
               if e.name.startswith("ddp bucket")]
    assert buckets and all(e.end - e.start >= 0.05 - 1e-6 for e in buckets)


def test_bad_network_is_refused():
    with pytest.raises(TypeError, match="network must have"):
        dt.run(lambda r, w: r, 2, network=Link(alpha=-1, beta=0))


def test_trace_layers_records_each_layers_forward_and_backward(capsys):
    def step(rank, world_size):
        model = dt.trace_layers(torch.nn.Sequential(
            torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.randn(4, 16)).sum().backward()

    events = dt.run(step, 2, trace=True).timeline.for_rank(0).events
    assert [e.name for e in events] == [
        "forward 0", "forward 2", "backward 2", "backward 0", "ddp bucket 0"]
    backward_0, bucket = events[3], events[4]
    assert backward_0.end <= bucket.start  # the bucket waits for layer 0's grads
    assert "backward hook" not in capsys.readouterr().err  # no torch warnings
