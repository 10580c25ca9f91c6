"""The simulated hardware: presets, the roofline, and clear errors."""
import pytest

from ddp_teach.cost import Link
from ddp_teach.sim import DEVICES, LINKS, Simulation, device, link
from ddp_teach.sim.model.hardware import Device


def test_the_roofline_takes_the_slower_of_arithmetic_and_memory_plus_a_launch():
    a100 = device("A100 80GB")
    # 1 TFLOP of fp32 at 19.5 TFLOP/s: compute-bound
    assert a100.op_seconds(1e12, 1e6) == pytest.approx(5e-6 + 1e12 / 19.5e12)
    # 2 GB of traffic at 2039 GB/s: memory-bound
    assert a100.op_seconds(1e6, 2e9) == pytest.approx(5e-6 + 2e9 / 2039e9)
    # bf16 matrix work runs at the tensor-core rate, 16x fp32's on an A100
    assert a100.op_seconds(1e12, 0, "bfloat16") == pytest.approx(5e-6 + 1e12 / 312e12)
    assert a100.op_seconds(1e12, 0, "int64") == a100.op_seconds(1e12, 0)


def test_presets_have_their_datasheet_numbers_and_are_found_by_loose_names():
    assert set(DEVICES) >= {"H100 SXM", "A100 80GB", "RTX 4090"}
    assert set(LINKS) >= {"NVLink 4", "PCIe 4 x16", "InfiniBand NDR", "100GbE", "10GbE"}
    assert device("h100sxm") is DEVICES["H100 SXM"]
    assert DEVICES["H100 SXM"].memory_bandwidth == 3350e9
    assert link("nvlink 4").bandwidth == pytest.approx(450e9)
    assert link("10GbE").bandwidth == pytest.approx(1.25e9)
    assert LINKS["PCIe 4 x16"].bandwidth < LINKS["NVLink 4"].bandwidth


def test_custom_hardware_is_accepted_and_named():
    mine = Device("my GPU", {"float32": 1e13}, memory_bandwidth=1e12,
                  memory_bytes=16e9)
    sim = Simulation(mine, Link.from_latency_bandwidth(1e-5, 2e10))
    assert sim.label == "simulated my GPU + a link of 10 us, 20 GB/s"
    assert Simulation("A100 80GB", "NVLink 4").label == \
        "simulated A100 80GB + NVLink 4"


def test_unknown_names_and_impossible_numbers_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="'A100 80GB'"):
        device("A200")
    with pytest.raises(ValueError, match="'NVLink 4'"):
        link("carrier pigeon")
    with pytest.raises(ValueError, match="float32"):
        Device("x", {"bfloat16": 1e12}, memory_bandwidth=1e9, memory_bytes=1e9)
    with pytest.raises(ValueError, match="finite and > 0"):
        Device("x", {"float32": 0.0}, memory_bandwidth=1e9, memory_bytes=1e9)
