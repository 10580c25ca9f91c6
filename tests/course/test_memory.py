"""dt.memory reproduces the ZeRO paper's memory and communication claims
(arXiv:1910.02054) and measures the same model states on a live model."""
import math

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from ddp_teach import memory

MODELS = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}
# The paper's Table 1, GB per device as printed: {model: {Nd: (os, os+g, os+g+p)}}.
TABLE_1 = {
    "7.5B": {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5),
             64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    "128B": {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128),
             64: (536, 284, 32), 256: (518, 263, 8), 1024: (513, 257, 2)},
    "1T": {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000),
           64: (4187, 2218, 250), 256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}
TABLE_1_CELLS = [(model, nd, stage, printed[stage - 1])
                 for model, rows in TABLE_1.items()
                 for nd, printed in rows.items()
                 for stage in (1, 2, 3)]


def test_table_1_has_all_54_cells():
    assert len(TABLE_1_CELLS) == 54


@pytest.mark.parametrize("model, nd, stage, printed_gb", TABLE_1_CELLS,
                         ids=[f"{m}-Nd{nd}-stage{s}" for m, nd, s, _ in TABLE_1_CELLS])
def test_formulas_reproduce_paper_table_1(model, nd, stage, printed_gb):
    # The paper truncates some cells (4187.5 -> 4187), so allow 1% or 0.01 GB.
    gb = memory.zero_bytes_per_device(MODELS[model], nd, stage) / 1e9
    assert math.isclose(gb, printed_gb, rel_tol=0.01, abs_tol=0.01), gb


@pytest.mark.parametrize("world_size", [1, 2, 7, 64, 4096])
def test_plain_dp_is_16_bytes_per_parameter_at_any_world_size(world_size):
    assert memory.zero_bytes_per_device(1000, world_size, stage=0) == 16_000


@pytest.mark.parametrize("k", [12, 8, 0])
def test_optimizer_bytes_per_param_is_the_papers_k(k):
    psi, nd = 1_000_000, 8
    expected = {0: (4 + k) * psi,
                1: 4 * psi + k * psi / nd,
                2: 2 * psi + (2 + k) * psi / nd,
                3: (4 + k) * psi / nd}
    for stage, bytes_ in expected.items():
        assert memory.zero_bytes_per_device(psi, nd, stage, k) == pytest.approx(bytes_)


def test_default_k_is_mixed_precision_adam():
    assert (memory.zero_bytes_per_device(10, 4, 1)
            == memory.zero_bytes_per_device(10, 4, 1, optimizer_bytes_per_param=12))
    assert (memory.zero_bytes_per_device(10, 4, 1)
            != memory.zero_bytes_per_device(10, 4, 1, optimizer_bytes_per_param=8))


def test_stage_3_communicates_1_5x_plain_dp_and_stages_1_2_the_same():
    psi = 7.5e9
    plain = memory.zero_comm_volume(psi, 0)
    assert plain == 2 * psi
    assert memory.zero_comm_volume(psi, 1) == plain
    assert memory.zero_comm_volume(psi, 2) == plain
    assert memory.zero_comm_volume(psi, 3) / plain == 1.5


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_adam_is_4_4_8_bytes_and_the_defaults_stay_mixed_precision(stage):
    psi, nd = 1_000_000, 4
    fp32 = {0: 16 * psi, 1: 8 * psi + 8 * psi / nd, 2: 4 * psi + 12 * psi / nd,
            3: 16 * psi / nd}
    assert memory.zero_bytes_per_device(
        psi, nd, stage, optimizer_bytes_per_param=8, param_bytes=4,
        grad_bytes=4) == pytest.approx(fp32[stage])
    assert memory.zero_bytes_per_device(psi, nd, stage) == \
        memory.zero_bytes_per_device(psi, nd, stage, 12, param_bytes=2, grad_bytes=2)
    # each kind of state is moved on its own
    assert memory.zero_bytes_per_device(psi, nd, stage, 0, param_bytes=1,
                                        grad_bytes=0) == (psi / nd if stage == 3 else psi)


@pytest.mark.parametrize("kwargs, names", [
    (dict(num_params=10, world_size=4, stage=4), "stage must be 0"),
    (dict(num_params=10, world_size=4, stage=-1), "stage must be 0"),
    (dict(num_params=10, world_size=4, stage=1.0), "stage must be 0"),
    (dict(num_params=10, world_size=0, stage=1), "world_size must be an integer >= 1"),
    (dict(num_params=10, world_size=2.0, stage=1), "world_size must be an integer >= 1"),
    (dict(num_params=10, world_size=True, stage=1), "world_size must be an integer >= 1"),
    (dict(num_params=-1, world_size=4, stage=1), "num_params must be a number >= 0"),
    (dict(num_params="7.5B", world_size=4, stage=1), "num_params must be a number >= 0"),
    (dict(num_params=float("nan"), world_size=4, stage=1), "num_params must be a number >= 0"),
    (dict(num_params=float("inf"), world_size=4, stage=1),
     "num_params must be a number >= 0 and finite, got inf"),
    (dict(num_params=10, world_size=4, stage=3, param_bytes=float("inf")),
     "param_bytes must be a number >= 0 and finite, got inf"),
    (dict(num_params=10, world_size=4, stage=1, optimizer_bytes_per_param=-4),
     "optimizer_bytes_per_param must be a number >= 0"),
    (dict(num_params=10, world_size=4, stage=1, param_bytes=-2),
     "param_bytes must be a number >= 0"),
    (dict(num_params=10, world_size=4, stage=1, grad_bytes="4"),
     "grad_bytes must be a number >= 0"),
])
def test_bad_arguments_raise_value_errors_that_say_what_is_allowed(kwargs, names):
    with pytest.raises(ValueError, match=names):
        memory.zero_bytes_per_device(**kwargs)


def test_comm_volume_validates_too():
    with pytest.raises(ValueError, match="stage must be 0"):
        memory.zero_comm_volume(10, 5)
    with pytest.raises(ValueError, match="num_params must be a number >= 0"):
        memory.zero_comm_volume(-10, 0)
    with pytest.raises(ValueError, match="num_params must be a number >= 0 and finite"):
        memory.zero_comm_volume(float("inf"), 0)


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_measure_before_backward_has_no_gradients():
    model = small_model()
    numel = sum(p.numel() for p in model.parameters())
    sizes = memory.measure_model_bytes(model)
    assert sizes == {"parameters": 4 * numel, "gradients": 0,
                     "optimizer_state": 0, "total": 4 * numel}


def test_measure_after_one_adam_step():
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)

    # torch 2.13's Adam keeps, per parameter tensor, exp_avg and exp_avg_sq
    # (fp32, shaped like the parameter) and a `step` counter: a 0-d fp32 tensor.
    for state in optimizer.state.values():
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        assert state["step"].dtype == torch.float32 and state["step"].dim() == 0
    step_counter_bytes = 4 * len(params)

    sizes = memory.measure_model_bytes(model, optimizer)
    assert sizes["parameters"] == 4 * numel
    assert sizes["gradients"] == 4 * numel
    assert sizes["optimizer_state"] == 2 * 4 * numel + step_counter_bytes
    assert sizes["total"] == 4 * 4 * numel + step_counter_bytes


def test_tied_weights_are_counted_once():
    embedding = nn.Embedding(10, 6)
    decoder = nn.Linear(6, 10, bias=False)
    decoder.weight = embedding.weight  # the same Parameter in two modules
    model = nn.Sequential(embedding, decoder)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.tensor([1, 2, 3])).sum().backward()
    optimizer.step()
    sizes = memory.measure_model_bytes(model, optimizer)
    assert sizes["parameters"] == 4 * 60
    assert sizes["gradients"] == 4 * 60
    assert sizes["optimizer_state"] == 2 * 4 * 60 + 4


def test_distinct_parameters_sharing_one_storage_are_counted_once():
    shared = torch.zeros(5, 4)
    model = nn.Module()
    model.a = nn.Parameter(shared)  # two Parameter objects, one storage:
    model.b = nn.Parameter(shared)  # model.parameters() lists both
    assert len(list(model.parameters())) == 2
    assert memory.measure_model_bytes(model)["parameters"] == 4 * 20


def test_extra_params_count_as_parameters_once_and_their_gradients_too():
    model = small_model()  # 212 parameters
    outside = nn.Parameter(torch.zeros(10))  # e.g. an optimizer's shard
    outside.grad = torch.ones(10)
    first_weight = next(model.parameters())
    alias = nn.Parameter(first_weight.data[0])  # shares the model's storage
    sizes = memory.measure_model_bytes(model, extra_params=[outside, alias])
    assert sizes["parameters"] == 4 * 212 + 4 * 10
    assert sizes["gradients"] == 4 * 10
    assert memory.measure_model_bytes(model)["parameters"] == 4 * 212


def test_format_bytes_uses_decimal_units():
    assert memory.format_bytes(0) == "0 B"
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(1_500_000) == "1.50 MB"
    assert memory.format_bytes(16 * 7.5e9) == "120.00 GB"
    assert memory.format_bytes(999_999) == "1.00 MB"
    assert memory.format_bytes(2**30) == "1.07 GB"  # a GiB is not a GB
    with pytest.raises(ValueError, match="num_bytes must be a number >= 0"):
        memory.format_bytes(-1)


def test_zero_table_has_the_right_numbers_in_the_right_places():
    table = memory.zero_table(7.5e9)
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()
            if line.split() and line.split()[0].isdigit()}
    assert list(rows) == ["1", "4", "16", "64", "256", "1024"]
    assert rows["1"] == ["120.00"] * 4
    assert rows["4"] == ["120.00", "52.50", "41.25", "30.00"]
    assert rows["1024"] == ["120.00", "30.09", "15.10", "0.12"]
    assert "7.5B" in table
    assert table.splitlines()[1].split() == \
        ["Nd", "DP", "(0)", "P_os", "(1)", "P_os+g", "(2)", "P_os+g+p", "(3)"]


def test_zero_table_columns_follow_the_stages_asked_for():
    table = memory.zero_table(1e12, world_sizes=(64,), stages=(3, 1))
    assert table.splitlines()[-1].split() == ["64", "250.00", "4187.50"]
    with pytest.raises(ValueError, match="stage must be 0"):
        memory.zero_table(1e12, stages=(4,))


def test_plot_has_one_labelled_line_per_stage(tmp_path):
    figure = memory.plot_zero_memory(7.5e9, world_sizes=(1, 8, 64), stages=(0, 2, 3))
    assert isinstance(figure, Figure)
    (axes,) = figure.axes
    lines = axes.get_lines()
    assert [line.get_label() for line in lines] == \
        ["stage 0: DP", "stage 2: P_os+g", "stage 3: P_os+g+p"]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == \
        [line.get_label() for line in lines]
    assert list(lines[2].get_xdata()) == [1, 8, 64]
    assert lines[2].get_ydata()[-1] == pytest.approx(16 * 7.5 / 64)
    assert axes.get_xscale() == "log"
    figure.savefig(tmp_path / "zero.png")
    assert (tmp_path / "zero.png").stat().st_size > 0
