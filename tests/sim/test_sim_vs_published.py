"""benchmarks/sim_vs_published.py's coverage table: which presets, GPU
counts and buffer sizes the validation rows within tolerance span, read
from the rows' own simulate calls; rows out of tolerance and calibration
rows count for nothing."""
import functools
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load():
    sys.path.insert(0, str(BENCHMARKS))   # it imports its neighbours
    try:
        spec = importlib.util.spec_from_file_location(
            "sim_vs_published", BENCHMARKS / "sim_vs_published.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def row(role, group, **simulate):
    return SimpleNamespace(role=role, group=group, published=10.0,
                           simulate=functools.partial(print, **simulate))


def test_the_coverage_table_spans_the_rows_within_tolerance_only():
    bench = load()
    table = [(row("validate", "collective", cluster="DGX H100", ranks=8, nbytes=2 ** 20), 10.5),
             (row("validate", "collective", cluster="DGX H100", ranks=16, nbytes=2 ** 33), 9.5),
             (row("validate", "collective", cluster="DGX H100", ranks=64, nbytes=2 ** 10), 20.0),
             (row("calibrate", "collective", cluster="DGX A100", ranks=8, nbytes=2 ** 30), 10.0),
             (row("validate", "kernel", device="B200"), 10.0)]
    lines = bench._coverage(table)
    assert "| DGX H100 | collective | 8 to 16 | 1 MiB to 8 GiB |" in lines
    assert "| B200 | kernel | 1 | - |" in lines
    assert not any(line.startswith("| DGX A100") for line in lines)
    assert any("Extrapolation" in line for line in lines)
