"""`ddp_teach.widgets`: the measurement, the plot and the explorer's wiring,
without a browser."""
import ipywidgets
import pytest
from matplotlib.figure import Figure

from ddp_teach import cost, memory, widgets
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


# ---- the ZeRO calculator -----------------------------------------------------

MIXED, FP32 = "mixed-precision Adam (2 + 2 + 12)", "fp32 AdamW (4 + 4 + 8)"


@pytest.mark.parametrize("precision", [MIXED, FP32])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_breakdown_adds_up_to_the_zero_formula(stage, precision):
    parts = widgets.zero_breakdown(7.5e9, 64, stage, precision)
    param_bytes, grad_bytes, k = widgets.PRECISIONS[precision]
    assert parts["total"] == pytest.approx(parts["parameters"] + parts["gradients"]
                                           + parts["optimizer_state"])
    assert parts["total"] == pytest.approx(memory.zero_bytes_per_device(
        7.5e9, 64, stage, k, param_bytes=param_bytes, grad_bytes=grad_bytes))


def test_breakdown_splits_one_more_state_per_stage():
    per = {s: widgets.zero_breakdown(1e9, 4, s) for s in range(4)}
    assert per[0] == dict(parameters=2e9, gradients=2e9, optimizer_state=12e9,
                          total=16e9)
    assert per[1]["optimizer_state"] == 3e9 and per[1]["gradients"] == 2e9
    assert per[2]["gradients"] == 0.5e9 and per[2]["parameters"] == 2e9
    assert per[3]["parameters"] == 0.5e9 and per[3]["total"] == 4e9


def test_summary_states_the_total_the_saving_and_the_traffic():
    text = widgets.zero_summary(7.5e9, 64, 3)
    assert "Psi = 7.5B parameters, Nd = 64 devices, stage 3 (P_os+g+p)" in text
    assert "1.88 GB per device (64.0x less than plain DP's 120.00 GB)" in text
    assert "3 Psi per step (1.5x plain DP's 2 Psi)" in text
    assert "2 Psi per step (as much as plain DP's" in widgets.zero_summary(
        7.5e9, 64, 1)


def test_breakdown_plot_has_a_stacked_bar_per_stage():
    fig = widgets.plot_zero_breakdown(7.5e9, 64, stage=2)
    ax, = fig.axes
    filled = [p for p in ax.patches if p.get_fill()]
    assert len(filled) == 3 * 4  # three states x four stages
    totals = {}
    for bar in filled:
        stage = round(bar.get_y() + bar.get_height() / 2)
        totals[stage] = max(totals.get(stage, 0), bar.get_x() + bar.get_width())
    for stage in range(4):
        assert totals[stage] == pytest.approx(
            memory.zero_bytes_per_device(7.5e9, 64, stage) / 1e9)
    outline, = [p for p in ax.patches if not p.get_fill()]
    assert round(outline.get_y() + outline.get_height() / 2) == 2


def _calculator_controls(box):
    sliders, stage, precision, out = box.children
    size, ranks = sliders.children
    return size, ranks, stage, precision, out


def _shown(out):
    return "".join(o.get("text", "") for o in out.outputs)


def test_calculator_shows_its_initial_state_before_any_change():
    box = widgets.zero_calculator()
    size, ranks, stage, precision, out = _calculator_controls(box)
    assert isinstance(box, ipywidgets.VBox)
    assert (size.value, ranks.value, stage.value, precision.value) == (
        7.5e9, 64, 3, MIXED)
    assert "1.88 GB per device" in _shown(out)
    assert sum("image/png" in o.get("data", {}) for o in out.outputs) == 1
    bundle = box._repr_mimebundle_()
    assert bundle["text/plain"] == widgets.zero_summary(7.5e9, 64, 3)
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_calculator_recomputes_on_every_change():
    box = widgets.zero_calculator()
    size, ranks, stage, precision, out = _calculator_controls(box)
    stage.value = 1
    assert "31.41 GB per device" in _shown(out)  # the paper: 31.4 at Nd = 64
    size.value, ranks.value = 1e12, 1024
    assert "Psi = 1T parameters, Nd = 1024 devices, stage 1" in _shown(out)
    precision.value = FP32
    assert FP32 in _shown(out)
    assert sum("image/png" in o.get("data", {}) for o in out.outputs) == 1
    assert box.summary() in _shown(out)


def test_calculator_accepts_a_size_and_world_size_off_the_sliders():
    box = widgets.zero_calculator(num_params=3e9, world_size=3, stage=0)
    size, ranks, *_ = _calculator_controls(box)
    assert size.value == 3e9 and ranks.value == 3
    assert "Psi = 3B parameters, Nd = 3 devices" in box.summary()
