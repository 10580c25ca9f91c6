"""Re-solve every calibrated constant of the simulator from its evidence rows.

Each constant of `ddp_teach.sim.calibrated`, `ddp_teach.sim.efficiency` and
`ddp_teach.sim.comm` that was solved from a published measurement is listed
in `CONSTANTS` with the rows it was solved from (the "calibrate" rows of
`benchmarks/published_rows.py`, by their `what`). Each is solved again: the
constant is set to a trial value in the live simulator, its row runs as
`benchmarks/sim_vs_published.py` runs it (training rows on the meta
device), and the value at which simulated / published = 1 is found by a
bracketed root find (regula falsi with the Illinois step; the figure is
monotonic in the constant; no scipy), every other constant at its stored
value. The dependencies run one way (kernel rows are benchmarks, run
without `sustained`; training rows use the kernel fractions) except in two
pairs solved from two rows together (`PAIRS`). Five fractions were written
as closed forms of their rows (a rate over the datasheet peak, the causal
figure over the full-mask one): their re-derived value is that closed form,
and the table shows how far the model's own root lies from it (the closed
forms leave out each kernel's fixed cost, kernel_s: 0.03-0.2%).

Tolerance: a stored constant matches when it equals the re-derived value to
half a unit of the last significant figure it is written with (three for
most: 0.851, 3.74e-6; four for the ratios of four-figure published figures
such as 327.9 / 989.4; two for EMULATED, NVLS_CHUNK_S and
NVLS_ONE_CHANNEL_S), a relative tolerance of 0.01% to 2.8%, printed per
constant: rounding is the only difference allowed. A row's figure moves at
most in proportion to its constant (seconds = fixed costs + work x constant
or / constant), so each row reproduces its published figure within its
constants' relative tolerance, plus the closed form's gap where there is one.

    .venv/bin/python tools/calibrate.py          # the table
    .venv/bin/python tools/calibrate.py --check  # exit 1 on any mismatch
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is not a package

from calibration_solver import (BY_NAME, ROWS, Constant, calibration_ratios,  # noqa: E402
                                ratio, solve, solve_together, with_value)
from ddp_teach.sim import calibrated, comm, efficiency, hardware  # noqa: E402

H100, A100 = "H100 SXM", "A100 80GB"
__all__ = ["BY_NAME", "ROWS", "CONSTANTS", "PAIRS", "calibration_ratios", "ratio",
           "resolve_all", "mismatches", "row_tolerances", "with_value", "main"]


def _fraction(device, field, stored, figures, row, note="", closed_form=None):
    return Constant(f"{device}: {field}", stored, figures, (row,), (0.05, 1.0),
                    device, field, note, closed_form)


def _share(row, device, peak):
    """A row's published rate over `device`'s datasheet `peak` ("memory" or
    a dtype): the closed form a constant was written as."""
    def share():
        d = hardware.DEVICES[device]
        rate = BY_NAME[row].published * 1e12  # TB/s or TFLOP/s
        return rate / (d.memory_bandwidth if peak == "memory" else d.flops[peak])
    return share


CLOSED = ("closed form, the row's figure over the datasheet peak; inverting the "
          "model instead gives {root:.6g} (the closed form leaves out each kernel's "
          "fixed cost, kernel_s)")


def _link(kind, row, figures=3, rows=None, note=""):
    return Constant(f"comm.ACHIEVED[{kind!r}]", comm.ACHIEVED[kind], figures,
                    rows or (row,), (0.05, 1.0), None, f"ACHIEVED:{kind}", note)


_H, _A = calibrated.ACHIEVED[H100], calibrated.ACHIEVED[A100]
_T4, _RTX = calibrated.ACHIEVED["T4"], calibrated.ACHIEVED["RTX 4090"]
CUDNN_ROWS = ("cuDNN attention fwd + bwd, causal, H100", "cuDNN attention fwd + bwd, H100")
NVLS_ROWS = ("all-reduce 8 GiB, 8 GPUs, NVLS", "all-reduce 64 MiB, 8 GPUs, NVLS")
KERNEL_ROWS = ("fp16 matmul 8192^3, A100", "fp16 matmul 1024^3, A100")
CONSTANTS = [
    _fraction(H100, "matmul", _H.matmul, 3, "bf16 matmul 2048 x 2048 x 13312, H100"),
    Constant(f"{A100}: matmul", _A.matmul, 3, KERNEL_ROWS, (0.05, 1.0), A100, "matmul",
             "with kernel_s as stored"),
    Constant("calibrated.KERNEL_S", calibrated.KERNEL_S, 3, KERNEL_ROWS[::-1],
             (1e-7, 2e-5), A100, "kernel_s", "every preset's kernel_s; solved with A100's matmul from both rows"),
    _fraction(H100, "memory", _H.memory, 3, "STREAM triad, H100", CLOSED,
              _share("STREAM triad, H100", H100, "memory")),
    _fraction(A100, "memory", _A.memory, 3, "STREAM triad, A100", CLOSED,
              _share("STREAM triad, A100", A100, "memory")),
    _fraction(H100, "attention", _H.attention, 4, "FlashAttention-2, H100", CLOSED,
              _share("FlashAttention-2, H100", H100, "bfloat16")),
    _fraction(A100, "attention", _A.attention, 4, "FlashAttention-2, A100", CLOSED,
              _share("FlashAttention-2, A100", A100, "bfloat16")),
    _fraction(H100, "attention_cudnn", _H.attention_cudnn, 4,
              "cuDNN attention fwd + bwd, H100", CLOSED,
              _share("cuDNN attention fwd + bwd, H100", H100, "bfloat16")),
    Constant("efficiency.CAUSAL", efficiency.CAUSAL, 4, CUDNN_ROWS, (0.05, 1.0), H100,
             "causal", "every preset's causal; closed form, the causal row's figure over "
             "the full-mask one's; inverting the model instead gives {root:.6g} (the "
             "closed form leaves out kernel_s, a larger share of the shorter causal run)",
             lambda: BY_NAME[CUDNN_ROWS[0]].published / BY_NAME[CUDNN_ROWS[1]].published),
    _fraction(H100, "matmul_fp32", _H.matmul_fp32, 3, "fp32 square matmul, best size, H100"),
    _fraction(A100, "matmul_fp32", _A.matmul_fp32, 3, "fp32 square matmul, best size, A100"),
    _fraction("T4", "matmul", _T4.matmul, 3, "fp16 square matmul, best size, T4 (Colab)"),
    _fraction("T4", "matmul_fp32", _T4.matmul_fp32, 3,
              "fp32 square matmul, best size, T4 (Colab)"),
    Constant("efficiency.EMULATED", efficiency.EMULATED, 2,
             ("bf16 square matmul, best size, T4 (Colab)",), (0.05, 1.0), None,
             "efficiency.EMULATED", "with T4's matmul_fp32"),
    _fraction("RTX 4090", "matmul", _RTX.matmul, 3,
              "fp16 square matmul, best size, RTX 4090 (a)"),
    _fraction("RTX 4090", "matmul_fp32", _RTX.matmul_fp32, 3,
              "fp32 square matmul, best size, RTX 4090 (a)"),
    _fraction(H100, "sustained", _H.sustained, 3, "MPT-7B FSDP, 8 H100"),
    _fraction(A100, "sustained", _A.sustained, 3, "MPT-7B FSDP, 8 A100",
              "V100's, T4's and RTX 4090's too"),
    _fraction(A100, "conv", _A.conv, 3, "ResNet-50, 1 A100",
              "with A100's sustained; every preset's conv"),
    _fraction(A100, "conv_tf32", _A.conv_tf32, 3, "ResNet-50 TF32, 1 A100",
              "with A100's sustained; H100's and RTX 4090's too"),
    Constant("calibrated.CONV_FP32", calibrated.CONV_FP32, 3, ("ResNet-50 FP32, 1 V100",),
             (0.05, 1.0), "V100 SXM2", "conv_fp32", "every preset's conv_fp32"),
    _link("in node", "all-reduce 16 GiB, 8 GPUs, ring"),
    _link("nvls", None, rows=NVLS_ROWS, note="with NVLS_CHUNK_S as stored"),
    Constant("comm.NVLS_CHUNK_S", comm.NVLS_CHUNK_S, 2, NVLS_ROWS[::-1], (1e-8, 5e-5),
             None, "comm.NVLS_CHUNK_S", "solved with the nvls fraction from both rows"),
    Constant("comm.NVLS_ONE_CHANNEL_S", comm.NVLS_ONE_CHANNEL_S, 2,
             ("all-reduce 128 KiB, 8 GPUs, NVLS",), (1e-8, 5e-5), None,
             "comm.NVLS_ONE_CHANNEL_S"),
    _link("across nodes", "all-reduce, 32 GPUs in 4 nodes"),
    _link("nvls tree", "all-reduce 512 MiB, 16 GPUs in 2 nodes"),
]
# the pairs solved from two rows together: {time constant: its fraction}.
# Both rows give both; the time constant was then rounded to its figures and
# the fraction solved again from its own row with it, as the stored values
# show (A100's matmul with kernel_s at 3.74e-6; "nvls" with 5.4e-6)
PAIRS = {"calibrated.KERNEL_S": f"{A100}: matmul",
         "comm.NVLS_CHUNK_S": "comm.ACHIEVED['nvls']"}
# what a "calibrate" constant of the simulator is that no row can give back
NOT_FROM_ROWS = {
    "Achieved.host_s_per_op (7e-6 s)": "a round figure from FlagGems issue 4812 "
    "(\"~7 us eager\"), which has no row; the course's own 7.56 us row validates it",
    "Achieved.overlap_slowdown (1.189)": "the average slowdown Lee et al. (arXiv "
    "2507.03114) report over many runs; no single row, so nothing to solve from",
    "H100's conv and conv_tf32; V100, T4, RTX 4090's other fractions": "copied from "
    "A100's (no run of theirs calibrates them), a stated assumption, not a solution",
}


def resolve_all(constants=None) -> dict:
    """{constant name: (re-derived value, the model's root)} for each of
    `constants` (default: CONSTANTS): the root from its first row, the
    others at their stored values (for a time constant of PAIRS, from both
    rows together); the re-derived value is the root, or the closed form
    where the constant was written as one."""
    result = {}
    by_name = {c.name: c for c in CONSTANTS}
    for constant in constants or CONSTANTS:
        fraction = PAIRS.get(constant.name)
        root = solve(constant) if fraction is None else \
            solve_together(constant, by_name[fraction])[0]
        result[constant.name] = (constant.closed_form() if constant.closed_form
                                 else root, root)
    return result


def mismatches(result: dict, constants=None) -> list:
    """Messages for the constants whose stored value differs from the
    re-derived one by more than rounding to its figures."""
    return [f"{c.name}: stored {c.stored:.6g}, but its rows ({'; '.join(c.rows)}) give "
            f"{result[c.name][0]:.6g} (tolerance {c.tolerance:.2g}: half a unit of its "
            f"figure number {c.figures}); set it to {result[c.name][0]:.{c.figures}g}, "
            "or find out why the row or the model changed"
            for c in constants or CONSTANTS if abs(result[c.name][0] - c.stored) > c.tolerance]


def row_tolerances(result: dict) -> dict:
    """{calibrate row: how far from 1 its ratio may be}: the relative
    tolerance of the constants solved from it (a row's figure moves at most
    in proportion to its constant), and for a closed form the gap between
    it and the model's root (what the closed form leaves out)."""
    tolerance = {}
    for c in CONSTANTS:
        derived, root = result[c.name]
        allowed = c.tolerance / abs(c.stored) + abs(derived - root) / abs(root)
        for row in c.rows:
            tolerance[row] = max(tolerance.get(row, 0.0), allowed)
    return tolerance


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a stored constant differs from its rows")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = resolve_all()
    print(f"{'constant':30} {'stored':>10} {'re-solved':>12} {'tolerance':>9}  rows; note")
    for c in CONSTANTS:
        derived, root = result[c.name]
        print(f"{c.name:30} {c.stored:10.4g} {derived:12.6g} "
              f"{c.tolerance / abs(c.stored):9.2%}  {'; '.join(c.rows)}"
              + (f"; {c.note.format(root=root)}" if c.note else ""))
    print("\nNot re-derived from rows:")
    for what, why in NOT_FROM_ROWS.items():
        print(f"- {what}: {why}")
    print(f"\n{len(CONSTANTS)} constants re-solved in {time.perf_counter() - start:.1f} s")
    if args.check:
        wrong = mismatches(result)
        sys.stdout.flush()
        for message in wrong:
            print("MISMATCH", message, file=sys.stderr)
        if wrong:
            return 1
        print("--check: every stored constant is what its rows give, to its figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
