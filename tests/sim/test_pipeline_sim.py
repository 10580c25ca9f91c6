"""Point-to-point messages in a simulated run, and GPipe's schedule: the
simulated pipeline step equals `predict.gpipe`, and the predictor gives
GPipe's bubble for equal stages on a free link."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_teach as dt
from ddp_teach.cost import Link, collective_time
from ddp_teach.sim import Simulation
from ddp_teach.sim.schedules import predict

SIM = Simulation("A100 80GB", "PCIe 4 x16")
WIDTH, BATCH = 64, 48


def ping(rank, world_size):
    """Rank 0 computes, then sends; rank 1 posts its recv at once."""
    x = torch.ones(256, 256)
    if rank == 0:
        y = (x @ x)[:16].contiguous()
        issued = dt.tracing.now()
        dist.send(y, dst=1)
    else:
        y = torch.empty(16, 256)
        issued = dt.tracing.now()
        dist.recv(y, src=0)
    return issued, dt.tracing.now(), y


def test_a_send_and_its_recv_start_together_and_cost_one_message():
    result = dt.run(ping, 2, simulate=SIM)
    (sent_at, sender_done, _), (posted_at, receiver_done, got) = result
    assert torch.equal(got, torch.full((16, 256), 256.0)), "real data moved"
    send, = [e for e in result.timeline.for_rank(0) if e.name == "send"]
    recv, = [e for e in result.timeline.for_rank(1) if e.name == "recv"]
    assert posted_at < sent_at, "the receiver was ready first"
    assert send.start == recv.start == sent_at, "it waited for the sender"
    message = collective_time("send_recv", 16 * 256 * 4, 2, SIM.link)
    assert send.end == recv.end == sender_done == receiver_done
    assert send.end - send.start == pytest.approx(message, rel=1e-12)


def test_a_recv_from_any_source_and_async_p2p_are_refused_by_name():
    def any_source(rank, world_size):
        if rank == 0:
            dist.send(torch.ones(1), dst=1)
        else:
            dist.recv(torch.ones(1))
    with pytest.raises(dt.WorkerError, match="needs its peer as a global rank"):
        dt.run(any_source, 2, simulate=SIM, timeout=20)

    def isends(rank, world_size):
        if rank == 0:
            dist.isend(torch.ones(1), dst=1).wait()
        else:
            dist.irecv(torch.ones(1), src=0).wait()
    with pytest.raises(dt.WorkerError, match="does not model dist.isend"):
        dt.run(isends, 2, simulate=SIM, timeout=20)


def layers():
    torch.manual_seed(0)
    return [nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH),
            nn.Tanh(), nn.Linear(WIDTH, WIDTH)]


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def pipeline_step(rank, world_size, micro_batches):
    x, y = data()
    stage = nn.Sequential(*dt.pipeline.split_layers(layers(), world_size)[rank])
    dist.barrier()
    last = rank == world_size - 1
    loss = dt.pipeline.gpipe_step(stage, x if rank == 0 else None,
                                  y if last else None, micro_batches,
                                  (BATCH // micro_batches, WIDTH))
    return loss, [p.grad for p in stage.parameters()]


@pytest.mark.parametrize("ranks,micro_batches", [(2, 1), (2, 4), (3, 3)])
def test_a_simulated_gpipe_step_takes_the_predicted_time(ranks, micro_batches):
    result = dt.run(pipeline_step, ranks, args=(micro_batches,), simulate=SIM)
    step = result.timeline.after_last_barrier()
    simulated = max(e.end for e in step) - min(e.start for e in step)
    x, y = data()
    rows = BATCH // micro_batches
    stages = [predict.pipeline_stage(nn.Sequential(*part), x[:rows],
                                     micro_batches, SIM, first=s == 0,
                                     target=y[:rows] if s == ranks - 1 else None)
              for s, part in enumerate(dt.pipeline.split_layers(layers(), ranks))]
    assert simulated == pytest.approx(predict.gpipe(stages, micro_batches, SIM.link),
                                      rel=1e-9)
    whole = nn.Sequential(*layers())
    torch.nn.functional.mse_loss(whole(x), y).backward()
    grads = [g for _, stage_grads in result for g in stage_grads]
    assert all(torch.allclose(g, p.grad, atol=1e-6)
               for g, p in zip(grads, whole.parameters(), strict=True)), \
        "the simulated run still computes the real gradients"


@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (4, 4), (3, 16)])
def test_equal_stages_on_a_free_link_give_gpipes_bubble(p, m):
    f, b = 1.0, 2.0
    stages = [predict.Stage(f, b, b, 0.0, 0)] * p
    step = predict.gpipe(stages, m, Link(0.0, 0.0))
    assert step == pytest.approx((m + p - 1) * (f + b))
    busy = m * (f + b)
    assert 1 - busy / step == pytest.approx(dt.pipeline.bubble_fraction(p, m))
