"""The RPC parameter server: synchronous it trains exactly as DDP does,
asynchronous it never waits, and it listens on the loopback only; where
torch has no RPC (Windows) the module still imports and says so."""
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

import ddp_teach as dt
from ddp_teach import paramserver

STEPS, LR, WORKERS = 8, 0.1, 2
TRUE_W = torch.linspace(-1, 1, 6).view(6, 1)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def batch_fn(worker, step):
    g = torch.Generator().manual_seed(1000 * step + worker)
    x = torch.randn(8, 6, generator=g)
    return x, x @ TRUE_W


def full_loss(params):
    model = make_model()
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(value)
        batches = [batch_fn(w, s) for w in range(WORKERS) for s in range(STEPS)]
        return sum(F.mse_loss(model(x), y) for x, y in batches).item() / len(batches)


def test_synchronous_server_trains_to_the_same_model_and_loss_as_ddp():
    served = dt.run(paramserver.train, WORKERS + 1, timeout=60,
                    args=(make_model, batch_fn, STEPS, LR))
    ddp = dt.run(paramserver.ddp_train, WORKERS, timeout=60,
                 args=(make_model, batch_fn, STEPS, LR))
    server = served[0]
    for got, want in zip(server["params"], ddp[0][0]):
        assert torch.allclose(got, want, atol=1e-6)  # the same SGD steps
    for worker in range(WORKERS):  # worker i read what DDP's rank i read
        assert served[worker + 1] == pytest.approx(ddp[worker][1], abs=1e-6)
    start = full_loss(make_model().parameters())
    ps_loss, ddp_loss = full_loss(server["params"]), full_loss(ddp[0][0])
    assert ps_loss == pytest.approx(ddp_loss, rel=1e-5) and ps_loss < start
    assert server["version"] == STEPS and set(server["staleness"]) == {0}


def test_server_traffic_is_a_model_in_and_out_per_worker_and_step():
    served = dt.run(paramserver.train, WORKERS + 1, timeout=60, trace=True,
                    args=(make_model, batch_fn, STEPS, LR))
    model_bytes = paramserver.tensor_bytes(list(make_model().parameters()))
    assert served[0]["bytes_in"] == WORKERS * STEPS * model_bytes
    assert served[0]["bytes_out"] == WORKERS * STEPS * model_bytes
    pushes = served.timeline.filter(name="push", rank=1)
    assert len(pushes) == STEPS and all(e.nbytes == model_bytes for e in pushes)
    assert len(served.timeline.filter(name="update", rank=0)) == WORKERS * STEPS


def test_asynchronous_server_steps_on_every_push_with_stale_gradients():
    served = dt.run(paramserver.train, WORKERS + 1, timeout=60,
                    args=(make_model, batch_fn, STEPS, LR,
                          paramserver.async_update),
                    kwargs={"delays": {2: 0.02}})  # worker 2 lags behind
    server = served[0]
    assert server["version"] == WORKERS * STEPS  # no push waited for another
    assert max(server["staleness"]) >= 1  # some gradients were out of date
    assert full_loss(server["params"]) < full_loss(make_model().parameters())


def listening_addresses(rank, world_size):
    paramserver.start_rpc(rank, world_size)
    rpc.rpc_sync(f"rank{(rank + 1) % world_size}", torch.add,
                 args=(torch.ones(2), 1))
    addresses = {c.laddr.ip for c in psutil.Process().net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
    rpc.shutdown()
    return addresses


def test_rpc_listens_on_the_loopback_only():
    for addresses in dt.run(listening_addresses, 2, timeout=30):
        assert addresses and addresses <= {"127.0.0.1", "::1"}, addresses


def failing_batches(worker, step):
    if worker == 1 and step == 2:
        raise ValueError("bad batch")
    return batch_fn(worker, step)


def test_a_failing_worker_is_reported_and_nothing_hangs():
    with pytest.raises(dt.WorkerError) as caught:
        dt.run(paramserver.train, WORKERS + 1, timeout=30,
               args=(make_model, failing_batches, STEPS, LR))
    assert caught.value.first_rank == 2 and "bad batch" in str(caught.value)


def test_worker_names():
    assert [paramserver.worker_name(r) for r in range(3)] == [
        "server", "worker1", "worker2"]


# torch for Windows has no RPC. Its torch.distributed.rpc imports but says
# is_available() is False; a build without distributed may fail to import it.
WITHOUT_RPC = """
import sys, torch
sys.modules["torch.distributed.rpc"] = None  # importing it now fails
sys.modules["torch.distributed.rpc.functions"] = None
del torch.distributed.rpc
import ddp_teach
from ddp_teach import paramserver
try:
    paramserver.start_rpc(0, 1)
except RuntimeError as error:
    print(error)
"""


def test_the_module_imports_without_rpc_and_says_why_it_cannot_serve():
    done = subprocess.run([sys.executable, "-c", WITHOUT_RPC], text=True,
                          capture_output=True, timeout=120,
                          cwd=Path(dt.__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert "needs torch.distributed.rpc" in done.stdout, done.stdout + done.stderr
    assert "import of torch.distributed.rpc halted" in done.stdout, "the cause"
    assert "WSL2" in done.stdout


def test_rpc_unavailable_in_this_build_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(rpc, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"is_available\(\) is False") as error:
        paramserver.train(1, 2, make_model, batch_fn, STEPS, LR)
    assert f"torch ({torch.__version__} on {sys.platform})" in str(error.value)
