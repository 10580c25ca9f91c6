"""benchmarks/gpu_vs_sim.py without a GPU: which preset a CUDA device name
gets, the simulated column, and a plain refusal where there is no CUDA (the
measured column needs `make bench-gpu` on a GPU machine)."""
import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_vs_sim.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_vs_sim", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the step at width 2048 alone takes the CPU ~20 s to simulate: one
    # wider width shows the rows are made
    module.WIDER = module.WIDER[:1]
    return module


@pytest.mark.parametrize("name, device, cluster", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "DGX H100"),
    ("NVIDIA H100 PCIe", "H100 SXM", None),
    ("NVIDIA H200", "H200 SXM", "DGX H200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB", "DGX A100"),
    ("NVIDIA A100-PCIE-40GB", "A100 80GB", None),
    ("Tesla T4", "T4", "2x T4 (Kaggle)"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", "4x RTX 4090"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2", None),
])
def test_a_cuda_device_name_gets_its_preset(bench, name, device, cluster):
    assert bench.preset_for(name)[:2] == (device, cluster)


def test_a_gpu_without_a_preset_is_named(bench, capsys):
    assert bench.preset_for("NVIDIA L4") is None
    assert bench.main(["--dry-run", "NVIDIA L4"]) == 1
    assert "no simulator preset for 'NVIDIA L4'" in capsys.readouterr().out


def test_the_simulated_column_of_two_t4s(bench):
    rows = bench.simulated("T4", "2x T4 (Kaggle)", 2, 128)
    assert "float16 matmul 4096 x 4096 x 4096" in rows        # T4 has no bf16
    assert all(value > 0 for value, _ in rows.values())
    sweep = [value for what, (value, unit) in rows.items() if what.startswith("all-reduce")]
    assert len(sweep) == len(bench.SWEEP_BYTES) and sweep == sorted(sweep)
    assert rows[bench.ddp_row(128, 2)][0] > rows["ResNet-50 AMP, batch 128, 1 GPU"][0]


def test_one_gpu_still_gets_a_ddp_row_through_the_launcher(bench):
    rows = bench.simulated("H100 SXM", None, 1, 256)   # an H100 PCIe box
    assert rows[bench.ddp_row(256, 1)] == rows["ResNet-50 AMP, batch 256, 1 GPU"]
    assert not any(what.startswith("all-reduce") for what in rows)


def test_the_capstone_step_it_times_runs_through_the_launcher(bench):
    import ddp_teach as dt
    (seconds,) = dt.run(bench.capstone_step, 1, args=("cpu", 2, 1), timeout=120)
    assert seconds > 0
    (phases,) = dt.run(bench.capstone_step, 1, args=("cpu", 2, 1), kwargs={"phases": True},
                       timeout=120)
    from capstone_step import PHASES  # (loading the benchmark put its folder on the path)
    assert list(phases) == list(PHASES) and all(s > 0 for s in phases.values())
    rows = bench.simulated("H100 SXM", "DGX H100", 1, 256)
    step, unit = rows[bench.CAPSTONE_ROW]
    assert unit == "ms" and step > 0
    # the phases, each read to the end of its last kernel, add up to the step
    parts = sum(rows[bench.phase_row(phase)][0] for phase in PHASES)
    assert parts == pytest.approx(step, rel=1e-9)
    width, _ = bench.WIDER[0]
    assert rows[bench.wider_row(width)][0] > step   # more arithmetic, not fewer kernels


def test_a_dry_run_prints_and_writes_nothing(bench, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "HERE", str(tmp_path))
    assert bench.main(["--dry-run", "NVIDIA H100 80GB HBM3"]) == 0
    out = capsys.readouterr().out
    assert "a dry run (simulated column only)" in out and "| - |" in out
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_where_to_run_it(bench, capsys):
    assert bench.main([]) == 1
    assert "make bench-gpu" in capsys.readouterr().out


def test_attention_is_timed_with_each_kernel_the_simulator_knows_for_the_gpu(bench):
    h100 = bench.simulated("H100 SXM", "DGX H100", 1, 256)
    flash, cudnn = (h100[bench.attention_row("bfloat16", kernel)][0]
                    for kernel in ("flash", "cudnn"))
    assert cudnn > 1.6 * flash
    a100 = bench.simulated("A100 80GB", "DGX A100", 1, 256)
    assert bench.attention_row("bfloat16", "flash") in a100
    assert not any("cudnn" in what for what in a100)


def test_the_capstone_profile_counts_what_the_host_issues_and_the_report_shows_it(bench):
    import ddp_teach as dt
    (counts,) = dt.run(bench.capstone_profile, 1, args=("cpu", 2, 1), timeout=120)
    # on the CPU no kernel runs on a GPU; the host still issues every operation
    assert counts["kernels"] == 0 and counts["gpu_busy_s"] == 0
    assert counts["aten_ops"] > 100          # forward, backward, DDP and AdamW
    simulated = bench.simulated("H100 SXM", "DGX H100", 1, 256)
    assert 0 < simulated[bench.BUSY_ROW][0] < simulated[bench.CAPSTONE_ROW][0]
    # the widest step's busy time too (the fixture keeps width 512 alone)
    width = bench.WIDER[-1][0]
    assert 0 < simulated[bench.busy_wide_row()][0] <= simulated[bench.wider_row(width)][0]
    # fp32 products run on the CUDA cores, at their own share of the fp32 peak
    assert simulated[bench.fp32_row()][0] < 0.1 * simulated[
        "bfloat16 matmul 8192 x 8192 x 8192"][0]
    measured = {bench.PROFILE_COUNTS[key][0]: counts[key] for key in ("kernels", "aten_ops")}
    # with the step's time, the host's time per operation, beside the simulator's charge
    assert bench.host_step_row(measured) == {}
    step = {**measured, bench.CAPSTONE_ROW: 4.24}
    assert bench.host_step_row(step)[bench.HOST_STEP_ROW] == \
        pytest.approx(4240 / counts["aten_ops"])
    assert simulated[bench.HOST_STEP_ROW][0] == pytest.approx(7.0)
    text = bench.report("NVIDIA H100 80GB HBM3", 1, ("H100 SXM", "DGX H100", ""),
                        simulated, measured, [], 1.0, dry=True)
    assert f"| {bench.PROFILE_COUNTS['aten_ops'][0]} | {counts['aten_ops']:,.3g} | - |" in text
