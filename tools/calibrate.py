"""Re-solve every calibrated constant of the simulator from its evidence rows.

Each constant of `ddp_teach.sim.model.calibrated` that was solved from a published
measurement is listed in `CONSTANTS`, with the rows it was solved from as
`calibrated.SOLVED_FROM` names them (the "calibrate" rows of
`ddp_teach/sim/evidence/*.toml`, by id). Each is solved again: the
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
most: 0.851, 3.74e-6; four for the closed-form shares, the memory and
attention fractions and CAUSAL: 0.8866; two for EMULATED, NVLS_CHUNK_S and
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

from calibration_solver import (BY_ID, ROWS, Constant, calibration_ratios,  # noqa: E402
                                ratio, solve, solve_together, with_value)
from ddp_teach.sim.model import calibrated, hardware  # noqa: E402

H100, A100 = "H100 SXM", "A100 80GB"
ROWS_OF = calibrated.SOLVED_FROM
__all__ = ["BY_ID", "ROWS", "CONSTANTS", "PAIRS", "calibration_ratios", "ratio",
           "resolve_all", "mismatches", "row_tolerances", "with_value", "main"]


def _fraction(device, field, figures, note="", closed_form=None):
    name = f"{device}: {field}"
    return Constant(name, calibrated.KERNEL_FRACTIONS[device][field], figures,
                    ROWS_OF[name], (0.05, 1.0), device, field, note, closed_form)


def _module(name, figures, bracket, device=None, field=None, note="", closed_form=None):
    """A constant of `calibrated` itself (set on `device`'s Achieved, as
    `field`, where that is how the simulator reads it)."""
    return Constant(name, getattr(calibrated, name), figures, ROWS_OF[name], bracket,
                    device, field or name, note, closed_form)


def _share(row, device, peak):
    """A row's published rate over `device`'s datasheet `peak` ("memory" or
    a dtype): the closed form a constant was written as."""
    def share():
        d = hardware.DEVICES[device]
        rate = BY_ID[row].published * 1e12  # TB/s or TFLOP/s
        return rate / (d.memory_bandwidth if peak == "memory" else d.flops[peak])
    return share


def _closed(device, field, peak):
    name = f"{device}: {field}"
    return _fraction(device, field, 4, CLOSED,
                     _share(ROWS_OF[name][0], device, peak))


CLOSED = ("closed form, the row's figure over the datasheet peak; inverting the "
          "model instead gives {root:.6g} (the closed form leaves out each kernel's "
          "fixed cost, kernel_s)")


def _link(kind, figures=3, note=""):
    name = f"LINK_FRACTIONS[{kind!r}]"
    return Constant(name, calibrated.LINK_FRACTIONS[kind], figures, ROWS_OF[name],
                    (0.05, 1.0), None, f"LINK_FRACTIONS:{kind}", note)


CAUSAL_ROWS = ROWS_OF["CAUSAL"]  # (causal row, full-mask row)
CONSTANTS = [
    _fraction(H100, "matmul", 3),
    _fraction(A100, "matmul", 3, "with kernel_s as stored"),
    _module("KERNEL_S", 3, (1e-7, 2e-5), A100, "kernel_s",
            "every preset's kernel_s; solved with A100's matmul from both rows"),
    _closed(H100, "memory", "memory"),
    _closed(A100, "memory", "memory"),
    _closed(H100, "attention", "bfloat16"),
    _closed(A100, "attention", "bfloat16"),
    _closed(H100, "attention_cudnn", "bfloat16"),
    _module("CAUSAL", 4, (0.05, 1.0), H100, "causal",
            "every preset's causal; closed form, the causal row's figure over the "
            "full-mask one's; inverting the model instead gives {root:.6g} (the closed "
            "form leaves out kernel_s, a larger share of the shorter causal run)",
            lambda: BY_ID[CAUSAL_ROWS[0]].published / BY_ID[CAUSAL_ROWS[1]].published),
    _fraction(H100, "matmul_fp32", 3),
    _fraction(A100, "matmul_fp32", 3),
    _fraction("T4", "matmul", 3),
    _fraction("T4", "matmul_fp32", 3),
    _module("EMULATED", 2, (0.05, 1.0), note="with T4's matmul_fp32"),
    _fraction("RTX 4090", "matmul", 3),
    _fraction("B200", "matmul", 3),
    _fraction("RTX 4090", "matmul_fp32", 3),
    _fraction(H100, "sustained", 3),
    _fraction(A100, "sustained", 3, "V100's, T4's and RTX 4090's too"),
    _fraction(A100, "conv", 3, "with A100's sustained; every preset's conv"),
    _fraction(A100, "conv_tf32", 3, "with A100's sustained; H100's and RTX 4090's too"),
    _module("CONV_FP32", 3, (0.05, 1.0), "V100 SXM2", "conv_fp32",
            "V100's, T4's and A100's conv_fp32"),
    _module("CONV_FP32_DOUBLED", 3, (0.05, 1.0), "H200 SXM", "conv_fp32",
            "on the CUDA cores (no sustained share); H100's, H200's, B200's and "
            "RTX 4090's conv_fp32"),
    _link("in node"),
    _link("nvls", note="with NVLS_CHUNK_S as stored"),
    _module("NVLS_CHUNK_S", 2, (1e-8, 5e-5),
            note="solved with the nvls fraction from both rows"),
    _module("NVLS_ONE_CHANNEL_S", 2, (1e-8, 5e-5)),
    _link("across nodes"),
    _link("nvls tree"),
    _link("host memory", note="simulated on the Kaggle preset (2 GPUs, PCIe 3.0, no P2P)"),
]
# the pairs solved from two rows together: {time constant: its fraction}.
# Both rows give both; the time constant was then rounded to its figures and
# the fraction solved again from its own row with it, as the stored values
# show (A100's matmul with kernel_s at 3.74e-6; "nvls" with 5.4e-6)
PAIRS = {"KERNEL_S": f"{A100}: matmul",
         "NVLS_CHUNK_S": "LINK_FRACTIONS['nvls']"}
# what a "calibrate" constant of the simulator is that no row can give back
NOT_FROM_ROWS = {
    "HOST_S_PER_OP (7e-6 s)": "a round figure from FlagGems issue 4812 "
    "(\"~7 us eager\"), which has no row; the course's own 7.56 us row validates it",
    "OVERLAP_SLOWDOWN (1.189)": "the average slowdown Lee et al. (arXiv "
    "2507.03114) report over many runs; no single row, so nothing to solve from",
    "H100's conv and conv_tf32; V100, T4, RTX 4090's other fractions": "copied from "
    "A100's (no run of theirs calibrates them), a stated assumption, not a solution",
    "B200's fractions but matmul": "the H100's, an assumption no Blackwell row "
    "calibrates (its memory share is validated by one row); B200 figures are extrapolation",
    "H200's fractions": "the H100's (the same chip with faster memory); the course's "
    "own H200 rows validate them",
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
