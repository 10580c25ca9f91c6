"""What fp32, fp16 and bf16 can hold, measured from torch: the facts behind
mixed-precision training.

A floating-point number is a sign, an exponent and a mantissa (IEEE 754-2019,
"IEEE Standard for Floating-Point Arithmetic"). The exponent's bits set the
*range* (the largest and smallest magnitudes), the mantissa's bits the
*precision* (how many nearby numbers can be told apart). fp16 (IEEE binary16)
spends 5 bits on the exponent and 10 on the mantissa; bf16 (Kalamkar et al.,
"A Study of BFLOAT16 for Deep Learning Training", 2019, arXiv:1905.12322)
keeps fp32's 8 exponent bits and only 7 mantissa bits: fp32's range, with
steps between neighbouring numbers 8 times coarser than fp16's. Micikevicius et al. ("Mixed Precision Training",
ICLR 2018, arXiv:1710.03740) showed that many gradients lie below fp16's
smallest number and vanish, and that scaling the loss lifts them back into
range. Every number here comes from `torch.finfo` or from casting a tensor,
never from a table typed in by hand, so it holds for the torch you run.
TF32, the tensor cores' format for fp32 inputs, has no torch dtype:
`to_tf32` rounds to it.

Figures are `matplotlib.figure.Figure` objects made without pyplot, as
elsewhere in the package.
"""
import math

import torch
from matplotlib.figure import Figure

FORMATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_INT_VIEW = {16: torch.int16, 32: torch.int32}


def _name(dtype: torch.dtype) -> str:
    return next((name for name, d in FORMATS.items() if d == dtype), str(dtype))


def layout(dtype: torch.dtype) -> tuple[int, int, int]:
    """(sign, exponent, mantissa) bits. The mantissa's width follows from the
    machine epsilon (eps = 2^-mantissa); the exponent takes the rest."""
    info = torch.finfo(dtype)
    mantissa = round(-math.log2(info.eps))
    return 1, info.bits - 1 - mantissa, mantissa


def format_info(dtype: torch.dtype) -> dict:
    """One format's widths and limits. The smallest subnormal is the smallest
    normal times eps: below 2^emin, IEEE 754 gives up the implicit leading 1,
    one mantissa bit at a time, down to a single last bit."""
    info = torch.finfo(dtype)
    sign, exponent, mantissa = layout(dtype)
    return {"name": _name(dtype), "bits": info.bits, "sign": sign,
            "exponent": exponent, "mantissa": mantissa, "max": info.max,
            "smallest_normal": info.smallest_normal,
            "smallest_subnormal": info.smallest_normal * info.eps,
            "eps": info.eps}


def format_table(dtypes=tuple(FORMATS.values())) -> str:
    """`format_info` as text: one column per dtype, one row per property."""
    infos = [format_info(dtype) for dtype in dtypes]
    rows = [[""] + [i["name"] for i in infos],
            ["sign/exponent/mantissa"]
            + [f"{i['sign']}/{i['exponent']}/{i['mantissa']}" for i in infos],
            ["max"] + [f"{i['max']:.6g}" for i in infos]]
    for key in ("smallest_normal", "smallest_subnormal", "eps"):
        rows.append([key.replace("_", " ")]
                    + [_with_power(i[key]) for i in infos])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join([r[0].ljust(widths[0])] + [
        cell.ljust(w) for cell, w in zip(r[1:], widths[1:])]).rstrip()
        for r in rows)


def _with_power(value: float) -> str:
    """3 significant digits and the power of two: '5.96e-08 (2^-24)'."""
    return f"{value:.3g} (2^{math.log2(value):g})"


def bit_string(value, dtype: torch.dtype) -> str:
    """The bits `value` is stored as in `dtype`, as 'sign|exponent|mantissa',
    e.g. 1.0 in fp16 is '0|01111|0000000000'. Read from memory by viewing
    the number as an integer of the same width."""
    sign, exponent, mantissa = layout(dtype)
    stored = torch.tensor(value, dtype=torch.float64).to(dtype).reshape(1)
    raw = stored.view(_INT_VIEW[torch.finfo(dtype).bits]).item()
    text = format(raw & ((1 << (sign + exponent + mantissa)) - 1),
                  f"0{sign + exponent + mantissa}b")
    return f"{text[:1]}|{text[1:1 + exponent]}|{text[1 + exponent:]}"


def stored_value(value, dtype: torch.dtype) -> float:
    """The number `dtype` actually keeps for `value` (rounded to nearest)."""
    return torch.tensor(value, dtype=torch.float64).to(dtype).item()


def to_tf32(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (fp32) rounded to TF32, as a tensor core reads fp32 inputs
    when TF32 is allowed: fp32's sign and 8 exponent bits, 10 of its 23
    mantissa bits, to nearest with ties away from zero (NVIDIA A100 Tensor
    Core GPU Architecture whitepaper, 2020; PTX's cvt.rna.tf32.f32; some
    kernels cut the bits off instead). The result is fp32 again, its 13
    lowest mantissa bits zero: a product of such inputs, added up in fp32,
    is close to what the tensor core computes. Non-finite values pass
    through."""
    x = tensor.float().contiguous()
    dropped = 23 - 10
    bits = x.view(torch.int32)
    # float bits are sign and magnitude: adding half of the dropped part
    # rounds the magnitude, for either sign
    rounded = ((bits + (1 << (dropped - 1))) & ~((1 << dropped) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


def underflow_fraction(tensor: torch.Tensor, dtype: torch.dtype) -> float:
    """Share of the nonzero values that become 0 when cast to `dtype`: the
    gradients a 16-bit backward pass would silently lose."""
    nonzero = tensor[tensor != 0]
    if nonzero.numel() == 0:
        return 0.0
    return (nonzero.to(dtype) == 0).float().mean().item()


def overflow_fraction(tensor: torch.Tensor, dtype: torch.dtype) -> float:
    """Share of the finite values that become inf when cast to `dtype`."""
    finite = tensor[torch.isfinite(tensor)]
    if finite.numel() == 0:
        return 0.0
    return torch.isinf(finite.to(dtype)).float().mean().item()


def round_gradients_to(model: torch.nn.Module, dtype=torch.float16) -> list:
    """Make backward behave, in range and rounding, as if it ran in `dtype`:
    every gradient flowing out of a layer, and every parameter's gradient,
    is rounded to `dtype` and back. Values below its range become 0, values
    above it inf, as on a GPU under fp16 autocast. A CPU stand-in for a real
    16-bit backward; returns the hook handles (call `.remove()` to undo)."""
    def rounded(grad):
        return grad.to(dtype).to(grad.dtype)

    def on_output(_module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(rounded)
    handles = [m.register_forward_hook(on_output) for m in model.modules()]
    handles += [p.register_hook(rounded) for p in model.parameters()]
    return handles


def plot_gradient_histogram(values: torch.Tensor, scale: float | None = None,
                            dtype=torch.float16, title: str | None = None,
                            bins: int = 80) -> Figure:
    """Histogram of log2|value| of the nonzero `values`, against `dtype`'s
    range: vertical lines at its smallest subnormal, smallest normal and
    max. Values left of the first line become 0 in `dtype`. With `scale`,
    the same values times `scale` are drawn too (loss scaling shifts the
    whole histogram right by log2(scale))."""
    info = format_info(dtype)
    values = values[values != 0].detach().float()
    if values.numel() == 0:
        raise ValueError("plot_gradient_histogram needs some nonzero values")
    series = [(values, "gradients", "#3b6fb6")]
    if scale is not None:
        series.append((values * scale, f"gradients x {scale:g}", "#e07b24"))
    logs = [data.abs().double().log2() for data, _, _ in series]
    low = min(min(x.min().item() for x in logs),
              math.log2(info["smallest_subnormal"])) - 2
    high = max(max(x.max().item() for x in logs),
               math.log2(info["max"])) + 2
    edges = torch.linspace(low, high, bins + 1).tolist()
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    axes = figure.add_subplot()
    for (data, label, color), log in zip(series, logs):
        lost = format_percent(underflow_fraction(data, dtype))
        axes.hist(log.numpy(), bins=edges, alpha=0.6, color=color,
                  label=f"{label} ({lost} become 0 in {info['name']})")
    limits = [("smallest subnormal", info["smallest_subnormal"], ":",
               f"2^{math.log2(info['smallest_subnormal']):g}"),
              ("smallest normal", info["smallest_normal"], "--",
               f"2^{math.log2(info['smallest_normal']):g}"),
              ("max", info["max"], "-", f"{info['max']:g}")]
    for what, value, style, shown in limits:
        axes.axvline(math.log2(value), color="black", linestyle=style,
                     label=f"{info['name']} {what} {shown}")
    # Below half the smallest subnormal, round-to-nearest gives 0.
    axes.axvspan(low, math.log2(info["smallest_subnormal"]) - 1, color="red",
                 alpha=0.08, label=f"becomes 0 or inf in {info['name']}")
    axes.axvspan(math.log2(info["max"]), high, color="red", alpha=0.08)
    axes.set_xlim(low, high)
    axes.set_xlabel("log2 |gradient|")
    axes.set_ylabel("count")
    axes.set_title(title or f"gradients against {info['name']}'s range")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure


def format_percent(fraction: float) -> str:
    """Whole percents, but two significant digits below 1%, so that a small
    share does not read as 0: 0.352 -> '35%', 5.4e-05 -> '0.0054%'."""
    if fraction == 0 or fraction >= 0.01:
        return f"{100 * fraction:.0f}%"
    return f"{100 * fraction:.2g}%"


def plot_scale_curve(scales, overflow_steps=(), ceiling=None,
                     title: str | None = None) -> Figure:
    """The loss scale used at each step (log2 axis), with the steps whose
    gradients overflowed (and were skipped) marked by red crosses.
    `ceiling`, if given, is the largest scale that fits at each step
    (e.g. 65504 / the largest gradient), drawn dashed."""
    figure = Figure(figsize=(8, 3.2), layout="constrained")
    axes = figure.add_subplot()
    steps = list(range(len(scales)))
    axes.step(steps, scales, where="post", color="#3b6fb6", label="loss scale")
    if ceiling is not None:
        axes.step(steps, ceiling, where="post", color="gray", linestyle="--",
                  label="largest scale that fits")
    bad = sorted(overflow_steps)
    axes.plot(bad, [scales[s] for s in bad], "x", color="#c0392b",
              markersize=9, mew=2, label="overflow: step skipped")
    axes.set_yscale("log", base=2)
    axes.set_xlabel("step")
    axes.set_ylabel("loss scale")
    axes.set_title(title or "dynamic loss scale")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    return figure
