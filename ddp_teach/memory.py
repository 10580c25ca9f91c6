"""Where the memory of data-parallel training goes, and what ZeRO removes.

Plain data parallelism (DDP) keeps a full copy of the *model states* on every
device: with mixed-precision Adam that is fp16 parameters (2 bytes per
parameter), fp16 gradients (2 bytes) and K = 12 bytes of fp32 master
parameters, momentum and variance -- 16 bytes per parameter, however many
devices there are. ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC'20, arXiv:1910.02054) removes
this redundancy by partitioning the states over the Nd data-parallel ranks:

    stage 0  DP        (2 + 2 + K) Psi
    stage 1  P_os      (2 + 2) Psi + K Psi / Nd
    stage 2  P_os+g    2 Psi + (2 + K) Psi / Nd
    stage 3  P_os+g+p  (2 + 2 + K) Psi / Nd

where Psi is the parameter count. These formulas reproduce the paper's
Table 1; `measure_model_bytes` measures the same quantities on a live model.
Sizes use decimal units (1 GB = 1e9 bytes), as the paper does. Activations,
temporary buffers and fragmentation are not model states and are not counted.
"""
import math
import numbers

import torch
from matplotlib.figure import Figure

FP16_PARAM_BYTES = 2
FP16_GRAD_BYTES = 2
ADAM_MIXED_PRECISION_K = 12  # fp32 master params + momentum + variance, 4 bytes each
STAGE_NAMES = {0: "DP", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
PAPER_WORLD_SIZES = (1, 4, 16, 64, 256, 1024)
DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def _check_stage(stage) -> None:
    if (isinstance(stage, bool) or not isinstance(stage, numbers.Integral)
            or stage not in STAGE_NAMES):
        raise ValueError(f"stage must be 0 (plain DP), 1 (P_os), 2 (P_os+g) "
                         f"or 3 (P_os+g+p), got {stage!r}")


def _check_non_negative(name: str, value) -> None:
    """A count or a size: a real number >= 0 and finite (an infinite one
    would make every result inf, which reads as an answer, not a mistake)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not 0 <= value < math.inf):
        raise ValueError(f"{name} must be a number >= 0 and finite, got {value!r}")


def zero_bytes_per_device(num_params, world_size, stage,
                          optimizer_bytes_per_param=ADAM_MIXED_PRECISION_K, *,
                          param_bytes=FP16_PARAM_BYTES,
                          grad_bytes=FP16_GRAD_BYTES) -> float:
    """Bytes of model states each of `world_size` devices holds under ZeRO `stage`.

    Stage 0 is plain data parallelism: every device holds fp16 parameters and
    gradients (`param_bytes` + `grad_bytes` = 2 + 2 bytes per parameter) and
    `optimizer_bytes_per_param` (the paper's K; 12 for mixed-precision Adam)
    of optimizer state, 16 bytes per parameter in all. Stage 1 splits the
    optimizer state over the devices, stage 2 also the gradients, stage 3
    also the parameters. Plain fp32 Adam (no master copy, two fp32 moments)
    is `param_bytes=4, grad_bytes=4, optimizer_bytes_per_param=8`.
    """
    _check_non_negative("num_params", num_params)
    if (isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral)
            or world_size < 1):
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    _check_stage(stage)
    _check_non_negative("optimizer_bytes_per_param", optimizer_bytes_per_param)
    _check_non_negative("param_bytes", param_bytes)
    _check_non_negative("grad_bytes", grad_bytes)
    params = param_bytes * num_params
    grads = grad_bytes * num_params
    optimizer = optimizer_bytes_per_param * num_params
    # Each stage moves one more kind of state from "replicated" to "partitioned".
    partitioned_kinds = [optimizer, grads, params][:stage]
    replicated_kinds = [optimizer, grads, params][stage:]
    return float(sum(replicated_kinds) + sum(partitioned_kinds) / world_size)


def zero_comm_volume(num_params, stage) -> float:
    """Data each device sends per training step, in units of parameters
    (multiply by bytes per element, 2 for fp16, to get bytes).

    Plain DP all-reduces the gradients: a reduce-scatter plus an all-gather,
    Psi each, 2 Psi in all. Stages 1 and 2 do the same two halves (reduce-
    scatter the gradients, all-gather the updated parameters), so still 2 Psi.
    Stage 3 must also all-gather the parameters again for the backward pass:
    3 Psi, 1.5x plain DP (section 7 of the paper).
    """
    _check_non_negative("num_params", num_params)
    _check_stage(stage)
    return float((3 if stage == 3 else 2) * num_params)


def format_count(num_params) -> str:
    """7.5e9 -> '7.5B', 1e12 -> '1T': parameter counts as the paper writes them."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if num_params >= scale:
            return f"{num_params / scale:g}{suffix}"
    return f"{num_params:g}"


def zero_table(num_params, world_sizes=PAPER_WORLD_SIZES, stages=(0, 1, 2, 3)) -> str:
    """A fixed-width text table of GB per device: one row per world size,
    one column per ZeRO stage (the layout of the paper's Table 1)."""
    rows = [[str(nd)] + [f"{zero_bytes_per_device(num_params, nd, s) / 1e9:.2f}"
                         for s in stages]
            for nd in world_sizes]
    headers = ["Nd"] + [f"{STAGE_NAMES[s]} ({s})" for s in stages]
    widths = [max(len(row[i]) for row in [headers] + rows) for i in range(len(headers))]

    def line(cells):
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))

    title = (f"GB per device, Psi = {format_count(num_params)} parameters, "
             f"mixed-precision Adam (K = {ADAM_MIXED_PRECISION_K})")
    return "\n".join([title, line(headers), line("-" * w for w in widths)]
                     + [line(row) for row in rows])


def plot_zero_memory(num_params, world_sizes=PAPER_WORLD_SIZES,
                     stages=(0, 1, 2, 3)) -> Figure:
    """GB of model states per device against world size, one line per stage."""
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for stage in stages:
        gigabytes = [zero_bytes_per_device(num_params, nd, stage) / 1e9
                     for nd in world_sizes]
        axes.plot(world_sizes, gigabytes, marker="o",
                  label=f"stage {stage}: {STAGE_NAMES[stage]}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(world_sizes, [str(nd) for nd in world_sizes])
    axes.minorticks_off()
    axes.set_ylim(bottom=0)
    axes.set_xlabel("data-parallel degree Nd (devices)")
    axes.set_ylabel("model states per device (GB)")
    axes.set_title(f"ZeRO memory per device, Psi = {format_count(num_params)} "
                   f"parameters, mixed-precision Adam")
    axes.grid(True, alpha=0.3)
    axes.legend()
    return figure


def measure_model_bytes(model: torch.nn.Module, optimizer=None, *,
                        extra_params=()) -> dict:
    """Bytes a live model's states hold: {"parameters", "gradients",
    "optimizer_state", "total"}.

    `extra_params`: parameters held outside `model` that count as its
    parameters too, their gradients as gradients (ZeRO's shard, which the
    optimizer owns; `dt.zero.model_state_bytes` passes it).

    Gradients count only where `.grad` is not None (none before the first
    backward). Optimizer state is every tensor in `optimizer.state`, including
    Adam's per-parameter `step` counter. Memory is counted per storage, not per
    tensor: a storage is charged once, in full, to the first category that
    uses it, so tied weights and views of one buffer are not counted twice.
    Buffers (e.g. BatchNorm running stats) are not model states and are left out.
    """
    seen_storages = set()

    def new_bytes(tensors) -> int:
        total = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            key = (tensor.device, storage.data_ptr())
            if key not in seen_storages:
                seen_storages.add(key)
                total += storage.nbytes()
        return total

    params = list(model.parameters()) + list(extra_params)
    sizes = {"parameters": new_bytes(params),
             "gradients": new_bytes(p.grad for p in params if p.grad is not None)}
    state = optimizer.state.values() if optimizer is not None else []
    sizes["optimizer_state"] = new_bytes(value for per_param in state
                                         for value in per_param.values()
                                         if isinstance(value, torch.Tensor))
    sizes["total"] = sum(sizes.values())
    return sizes


def format_bytes(num_bytes) -> str:
    """Bytes in decimal units, as the paper uses: 1_500_000 -> '1.50 MB'
    (1 kB = 1e3 bytes, 1 GB = 1e9 bytes, not 2**30)."""
    _check_non_negative("num_bytes", num_bytes)
    if num_bytes < 1000:
        return f"{num_bytes:g} B"
    value, unit = num_bytes / 1000, DECIMAL_UNITS[1]
    for larger_unit in DECIMAL_UNITS[2:]:
        if round(value, 2) < 1000:  # so 999_999 B reads "1.00 MB", not "1000.00 kB"
            break
        value, unit = value / 1000, larger_unit
    return f"{value:.2f} {unit}"
