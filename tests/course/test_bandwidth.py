"""The bandwidth sweep: real collectives timed size by size, in nccl-tests'
units, and the alpha-beta model fitted to them."""
import math
import re

import pytest
from matplotlib.figure import Figure

from ddp_teach import bandwidth, cost, launcher
from ddp_teach.system import choose_backend


@pytest.mark.parametrize("call, message", [
    (lambda: bandwidth.sweep(2, op="all_to_all"), "valid: all_reduce"),
    (lambda: bandwidth.sweep(2, op="send_recv"), "cannot sweep 'send_recv'"),
    (lambda: bandwidth.sweep(2, sizes=[]), "sizes"),
    (lambda: bandwidth.sweep(2, sizes=[4096, -8]), "sizes"),
    (lambda: bandwidth.sweep(0), "world_size"),
    (lambda: bandwidth.sweep(2, iters=0), "iters"),
])
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter",
                                "broadcast"])
def test_a_real_sweep_on_two_ranks(op):
    sweep = bandwidth.sweep(2, sizes=[4096, 65536, 262144], op=op,
                            iters=3, warmup=1, timeout=60)
    assert (sweep.op, sweep.world_size) == (op, 2)
    assert sweep.backend == choose_backend("auto", 2)
    assert [r.size_bytes for r in sweep.rows] == [4096, 65536, 262144]
    for row in sweep.rows:
        assert 0 < row.seconds < 10
        assert row.algbw == pytest.approx(row.size_bytes / row.seconds)
        assert row.busbw == pytest.approx(row.algbw * cost.busbw_factor(op, 2))
    table = sweep.table()
    assert all(str(size) in table for size in (4096, 65536, 262144))
    assert "algbw (GB/s)" in table and "busbw (GB/s)" in table
    link = sweep.fit()
    assert link.alpha >= 0 and link.beta >= 0 and link.alpha + link.beta > 0
    fig = sweep.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    time_ax, bw_ax = fig.axes
    assert time_ax.get_xscale() == time_ax.get_yscale() == "log"
    assert "time" in time_ax.get_ylabel() and "busbw" in bw_ax.get_ylabel()
    assert len(fig.legends) == 1


def test_sweep_rounds_sizes_to_whole_elements_per_rank():
    sweep = bandwidth.sweep(2, sizes=[1000, 4101], op="reduce_scatter",
                            iters=1, warmup=0)
    assert [r.size_bytes for r in sweep.rows] == [1000, 4104]  # 2 x 513 floats
    assert all(math.isfinite(r.busbw) for r in sweep.rows)


def test_sweep_time_is_the_slowest_ranks_median(monkeypatch):
    class FakeResult(list):  # what dt.run returns: per-rank values, .backend
        backend = "gloo"

    def fake_run(fn, world_size, **kwargs):  # per-rank medians, per size
        return FakeResult([[1e-3, 2e-3], [3e-3, 1e-3], [2e-3, 4e-3]])
    monkeypatch.setattr(launcher, "run", fake_run)
    sweep = bandwidth.sweep(3, sizes=[1200, 2400], op="all_reduce")
    assert [r.seconds for r in sweep.rows] == [3e-3, 4e-3]
    assert [r.busbw for r in sweep.rows] == pytest.approx(
        [1200 / 3e-3 * 4 / 3, 2400 / 4e-3 * 4 / 3])


def test_the_plot_marks_the_fitted_rings_busbw_limit_one_over_beta(monkeypatch):
    class FakeResult(list):
        backend = "gloo"
    sizes = [4096, 65536, 1048576]
    link = cost.Link.from_latency_bandwidth(20e-6, 2e9)
    per_size = [cost.allreduce_time(n, 2, link) for n in sizes]
    monkeypatch.setattr(launcher, "run", lambda fn, world_size, **kwargs:
                        FakeResult([per_size, per_size]))
    sweep = bandwidth.sweep(2, sizes=sizes)
    fitted = sweep.fit()
    assert fitted.bandwidth == pytest.approx(2e9, rel=1e-6)
    _, bw_ax = sweep.plot().axes
    limit = bw_ax.get_lines()[-1]          # the dotted line: busbw as size -> inf
    assert limit.get_linestyle() == ":"
    assert limit.get_ydata()[0] == pytest.approx(fitted.bandwidth / cost.GB)
