"""dt.precision measures fp32 / fp16 / bf16 from torch: the numbers must be
IEEE 754's (binary32, binary16) and bfloat16's (arXiv:1905.12322), the bits
must be the ones in memory, and the figures must draw fp16's real limits."""
import math

import pytest
import torch
from matplotlib.figure import Figure

from ddp_teach import precision

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16


def test_fp16_limits_are_ieee_binary16():
    info = precision.format_info(FP16)
    assert (info["sign"], info["exponent"], info["mantissa"]) == (1, 5, 10)
    assert info["max"] == 65504.0
    assert info["smallest_normal"] == 2.0 ** -14
    assert info["smallest_subnormal"] == 2.0 ** -24
    assert info["eps"] == 2.0 ** -10


@pytest.mark.parametrize("dtype", [FP32, FP16, BF16])
def test_smallest_subnormal_is_the_real_edge(dtype):
    """The derived value survives a cast; half of it rounds (to even) to 0."""
    tiny = precision.format_info(dtype)["smallest_subnormal"]
    assert torch.tensor(tiny, dtype=torch.float64).to(dtype).item() == tiny
    assert torch.tensor(tiny / 2, dtype=torch.float64).to(dtype).item() == 0.0


def test_bf16_has_fp32s_range_and_fewer_mantissa_bits():
    fp32, bf16 = precision.format_info(FP32), precision.format_info(BF16)
    assert (bf16["sign"], bf16["exponent"], bf16["mantissa"]) == (1, 8, 7)
    assert bf16["exponent"] == fp32["exponent"]  # the same range...
    assert math.isclose(bf16["max"], 3.3895313892515355e38)
    assert 0.99 < bf16["max"] / fp32["max"] < 1.0  # ...just below fp32's max
    assert bf16["smallest_normal"] == fp32["smallest_normal"] == 2.0 ** -126
    assert bf16["eps"] == 2.0 ** -7  # 8 significant bits with the implicit 1


def test_table_shows_each_format_with_its_limits():
    table = precision.format_table()
    assert table.splitlines()[0].split() == ["fp32", "fp16", "bf16"]
    assert "65504" in table and "(2^-24)" in table and "(2^-133)" in table
    assert "1/5/10" in table and "1/8/7" in table and "1/8/23" in table
    assert max(len(line) for line in table.splitlines()) <= 80


@pytest.mark.parametrize("value, dtype, bits", [
    (1.0, FP16, "0|01111|0000000000"),
    (1.0, BF16, "0|01111111|0000000"),
    (1.0, FP32, "0|01111111|00000000000000000000000"),
    (-2.5, FP16, "1|10000|0100000000"),          # -1.01b x 2^1
    (65504.0, FP16, "0|11110|1111111111"),       # the largest finite fp16
    (70000.0, FP16, "0|11111|0000000000"),       # overflow: inf
    (2.0 ** -24, FP16, "0|00000|0000000001"),    # the smallest subnormal
    (1e-8, FP16, "0|00000|0000000000"),          # underflow: 0
])
def test_bit_strings_are_what_memory_holds(value, dtype, bits):
    assert precision.bit_string(value, dtype) == bits


@pytest.mark.parametrize("value", [1.0, -2.5, 3.0, 0.15625, 2.0 ** -100])
def test_bf16_bits_are_the_top_half_of_fp32s(value):
    """For values bf16 holds exactly, bf16 is fp32 with the low 16 bits cut."""
    fp32 = precision.bit_string(value, FP32).replace("|", "")
    bf16 = precision.bit_string(value, BF16).replace("|", "")
    assert bf16 == fp32[:16]


def test_precision_one_plus_a_little():
    """8 significant bits: 1 + 2^-8 is a tie and rounds to even, i.e. to 1."""
    assert precision.stored_value(1 + 2 ** -8, BF16) == 1.0
    assert precision.stored_value(1 + 2 ** -7, BF16) == 1 + 2 ** -7
    assert precision.stored_value(1 + 2 ** -11, FP16) == 1.0
    assert precision.stored_value(1 + 2 ** -10, FP16) == 1 + 2 ** -10


def test_underflow_fraction():
    tiny = torch.full((100,), 1e-8)
    assert precision.underflow_fraction(tiny, FP16) == 1.0
    assert precision.underflow_fraction(tiny, BF16) == 0.0
    mixed = torch.tensor([1e-8, 1e-3, 0.0, 0.0, 2e-8, 1.0])  # zeros don't count
    assert precision.underflow_fraction(mixed, FP16) == 0.5
    assert precision.underflow_fraction(torch.zeros(3), FP16) == 0.0


def test_overflow_fraction():
    values = torch.tensor([70000.0, 1.0, -1e5, math.inf])  # inf doesn't count
    assert precision.overflow_fraction(values, FP16) == pytest.approx(2 / 3)
    assert precision.overflow_fraction(values, BF16) == 0.0


def test_round_gradients_to_fp16_flushes_and_saturates_like_fp16():
    layer = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    x = torch.tensor([[1e-9, 1e-3, 1e5]])
    handles = precision.round_gradients_to(layer, FP16)
    layer(x).sum().backward()
    rounded = layer.weight.grad.clone()
    assert rounded.tolist() == [[0.0, precision.stored_value(1e-3, FP16), math.inf]]
    for handle in handles:
        handle.remove()
    layer.weight.grad = None
    layer(x).sum().backward()  # hooks removed: fp32 gradients again
    assert layer.weight.grad[0, 0].item() == pytest.approx(1e-9)
    assert math.isfinite(layer.weight.grad[0, 2].item())


def test_round_gradients_rounds_what_flows_between_layers():
    model = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False),
                                torch.nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[1].weight.fill_(1e-9)  # the gradient reaching layer 0 is 1e-9
    precision.round_gradients_to(model, FP16)
    model(torch.ones(1, 1)).sum().backward()
    assert model[0].weight.grad.item() == 0.0  # lost between the layers


def test_gradient_histogram_draws_fp16s_limits():
    grads = torch.logspace(-12, 0, 500)
    figure = precision.plot_gradient_histogram(grads, scale=65536.0)
    assert isinstance(figure, Figure)
    axes = figure.axes[0]
    vertical = sorted(line.get_xdata()[0] for line in axes.get_lines())
    assert vertical == pytest.approx([-24, -14, math.log2(65504)])
    labels = [t.get_text() for t in axes.get_legend().get_texts()]
    assert any("smallest subnormal 2^-24" in label for label in labels)
    assert "fp16 smallest normal 2^-14" in labels
    assert "fp16 max 65504" in labels
    assert sum("become 0 in fp16" in label for label in labels) == 2  # raw + scaled
    assert axes.get_xlabel() == "log2 |gradient|"


def test_gradient_histogram_reports_the_underflow_share():
    grads = torch.tensor([1e-9] * 3 + [1e-2])  # 3 of 4 flush to 0 in fp16
    figure = precision.plot_gradient_histogram(grads)
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert "gradients (75% become 0 in fp16)" in labels


@pytest.mark.parametrize("fraction, shown", [
    (0.0, "0%"), (0.352, "35%"), (1.0, "100%"), (0.005, "0.5%"),
    (5.4e-05, "0.0054%")])
def test_shares_are_shown_without_reading_as_zero(fraction, shown):
    assert precision.format_percent(fraction) == shown


def test_gradient_histogram_refuses_all_zeros():
    with pytest.raises(ValueError, match="nonzero"):
        precision.plot_gradient_histogram(torch.zeros(4))


def test_scale_curve_marks_overflow_steps():
    scales = [8.0, 4.0, 4.0, 8.0, 8.0, 4.0]
    figure = precision.plot_scale_curve(scales, overflow_steps=[0, 4])
    axes = figure.axes[0]
    assert axes.get_yscale() == "log"
    curve, crosses = axes.get_lines()
    assert list(crosses.get_xdata()) == [0, 4]
    assert list(crosses.get_ydata()) == [8.0, 8.0]  # at the scale that overflowed
    assert list(curve.get_ydata()) == scales


def test_scale_curve_can_draw_the_ceiling():
    figure = precision.plot_scale_curve([8.0, 4.0], [0], ceiling=[5.0, 6.0])
    curve, ceiling, crosses = figure.axes[0].get_lines()
    assert list(ceiling.get_ydata()) == [5.0, 6.0]
    assert ceiling.get_linestyle() == "--"
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert labels == ["loss scale", "largest scale that fits",
                      "overflow: step skipped"]


def test_tf32_keeps_ten_mantissa_bits_and_rounds_to_nearest():
    import struct
    x = torch.tensor([1.0, 1 + 2 ** -10, 1 + 2 ** -11, 1 + 2 ** -11 - 2 ** -20,
                      -(1 + 2 ** -11), 3.0e38, float("inf"), float("nan")])
    y = precision.to_tf32(x)
    assert y.dtype == torch.float32
    assert y[0] == 1.0 and y[1] == 1 + 2 ** -10             # kept: 10 bits
    assert y[2] == 1 + 2 ** -10                              # a tie: away from 0
    assert y[3] == 1.0                                       # below half: down
    assert y[4] == -(1 + 2 ** -10)                           # the same for negatives
    assert torch.isinf(y[6]) and torch.isnan(y[7])
    finite = y[:6]
    low_bits = [struct.unpack("<I", struct.pack("<f", v))[0] & 0x1FFF
                for v in finite.tolist()]
    assert low_bits == [0] * 6
    g = torch.Generator().manual_seed(0)
    r = torch.randn(10_000, generator=g)
    rel = ((precision.to_tf32(r) - r).abs() / r.abs()).max().item()
    assert 2 ** -12 < rel <= 2 ** -11                        # half of TF32's step
