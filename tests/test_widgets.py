"""`ddp_teach.widgets`: the measurement, the plot and the explorer's wiring,
without a browser."""
import ipywidgets
import pytest
from matplotlib.figure import Figure

from ddp_teach import cost, widgets
from ddp_teach.widgets import Run

LINK = cost.Link(alpha=50e-6, beta=1e-9)


def test_measure_allreduce_returns_a_positive_time():
    seconds = widgets.measure_allreduce(2, 4096, repeats=2)
    assert 0 < seconds < 5


def test_plot_runs_draws_the_measured_points_and_the_model():
    runs = [Run(2, 4096, 1e-4), Run(2, 65536, 3e-4), (4, 4096, 2e-4)]
    fig = widgets.plot_runs(runs, LINK)
    assert isinstance(fig, Figure)
    ax, = fig.axes
    measured = {int(line.get_label().split()[0]):
                list(zip(line.get_xdata(), line.get_ydata()))
                for line in ax.get_lines() if line.get_marker() == "o"}
    assert measured[2] == [(4096, pytest.approx(100)), (65536, pytest.approx(300))]
    assert measured[4] == [(4096, pytest.approx(200))]
    model = [line for line in ax.get_lines() if "model" in line.get_label()]
    assert len(model) == 2
    x, y = model[0].get_xdata(), model[0].get_ydata()
    assert y[0] == pytest.approx(cost.allreduce_time(x[0], 2, LINK) * 1e6)


def test_plot_runs_with_no_runs_is_an_empty_plot():
    assert widgets.plot_runs([], LINK).axes[0].get_lines() == []


def _controls(box):
    row, out = box.children
    ranks, size, button = row.children
    return ranks, size, button, out


def test_explorer_has_the_controls():
    box = widgets.allreduce_explorer(world_sizes=(2, 4), sizes_kb=(4, 64),
                                     link=LINK)
    assert isinstance(box, ipywidgets.Widget)
    ranks, size, button, out = _controls(box)
    assert isinstance(ranks, ipywidgets.Dropdown) and list(ranks.options) == [2, 4]
    assert isinstance(size, ipywidgets.SelectionSlider)
    assert [label for label, _ in size.options] == ["4 KB", "64 KB"]
    assert size.value == 4096
    assert isinstance(button, ipywidgets.Button)
    assert isinstance(out, ipywidgets.Output)
    assert box.runs == []


def test_each_click_measures_once_and_replots_every_run():
    box = widgets.allreduce_explorer(world_sizes=(2, 3), sizes_kb=(4, 64),
                                     link=LINK)
    ranks, size, button, out = _controls(box)
    button.click()
    assert [(r.world_size, r.nbytes) for r in box.runs] == [(2, 4096)]
    assert box.runs[0].seconds > 0
    text = "".join(o.get("text", "") for o in out.outputs)
    assert "measured" in text and "ring model" in text and "4 KB on 2 ranks" in text
    predicted = cost.allreduce_time(4096, 2, LINK) * 1e6
    assert f"ring model {predicted:.1f} µs" in text
    assert any("image/png" in o.get("data", {}) for o in out.outputs)

    ranks.value, size.value = 3, 65536
    button.click()
    assert [(r.world_size, r.nbytes) for r in box.runs] == [(2, 4096), (3, 65536)]
    assert sum("image/png" in o.get("data", {}) for o in out.outputs) == 1
    assert not button.disabled


def test_an_error_is_shown_in_the_output(monkeypatch):
    def fails(world_size, nbytes, repeats=3):
        raise RuntimeError("rank 1 failed")
    monkeypatch.setattr(widgets, "measure_allreduce", fails)
    box = widgets.allreduce_explorer(link=LINK)
    *_, button, out = _controls(box)
    button.click()
    assert box.runs == []
    assert "RuntimeError: rank 1 failed" in "".join(o.get("text", "")
                                                    for o in out.outputs)


def test_without_a_link_one_is_fitted_once():
    widgets.fitted_link.cache_clear()
    link = widgets.fitted_link()
    assert isinstance(link, cost.Link) and link.beta > 0
    assert widgets.fitted_link() is link
    box = widgets.allreduce_explorer(link=None)
    *_, button, out = _controls(box)
    button.click()
    text = "".join(o.get("text", "") for o in out.outputs)
    assert f"model fitted on 2 ranks: {widgets.describe_link(link)}" in text
    assert len(box.runs) == 1
