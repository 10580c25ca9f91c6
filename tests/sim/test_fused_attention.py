"""scaled_dot_product_attention is charged as one fused kernel (flash or
cuDNN's) forward and one backward, the same on meta and CPU tensors, and the
simulation leaves its results exactly as torch computes them."""
import pytest
import torch
import torch.nn.functional as F

import ddp_teach as dt
from ddp_teach.sim import Simulation
from ddp_teach.sim.schedules import predict
from ddp_teach.sim.runtime.charges import attention_seconds
from ddp_teach.sim.runtime.recorder import SimulatedRecorder

SIMULATIONS = [Simulation("H100 SXM", cluster="DGX H100"),
               Simulation("A100 80GB", "NVLink 4")]


def qkv(device, batch=2, heads=4, length=256, head_dim=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, head_dim, generator=g, dtype=dtype)
            .to(device).requires_grad_() for _ in range(3)]


def attention_times(simulation, device, **shape):
    q, k, v = qkv(device, **shape)
    prof = predict.profile(torch.nn.Module(), lambda _: F.scaled_dot_product_attention(
        q, k, v, is_causal=True).sum(), simulation)
    return prof.forward_s, prof.backward_s


@pytest.mark.parametrize("simulation", SIMULATIONS, ids=lambda s: s.compute)
def test_the_same_charge_on_meta_and_cpu_tensors(simulation):
    for dtype in (torch.float32, torch.bfloat16):
        assert attention_times(simulation, "meta", dtype=dtype) == \
            attention_times(simulation, "cpu", dtype=dtype)


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_the_charge_is_the_fused_kernels_not_the_score_matrix(kernel):
    sim = Simulation("H100 SXM", cluster="DGX H100", attention=kernel)
    with torch.device("meta"):
        q, k, v = (torch.empty(2, 32, 8192, 128, dtype=torch.bfloat16) for _ in range(3))
    forward = attention_seconds(sim, q, k, v, causal=True, backward=False)
    a = sim.achieved
    fraction = {"flash": a.attention, "cudnn": a.attention_cudnn}[kernel]
    flops = 4 * 2 * 32 * 8192 * 8192 * 128 / 2
    assert forward == pytest.approx(a.kernel_s + flops / (989.4e12 * fraction * a.causal
                                                          * a.sustained))
    assert attention_seconds(sim, q, k, v, causal=True, backward=True) - a.kernel_s \
        == pytest.approx(2.5 * (forward - a.kernel_s))
    # the math path on meta would write the 8192 x 8192 scores of 64 heads:
    # the fused charge is far below even those bytes' time
    scores_s = 2 * 32 * 8192 * 8192 * 4 / (3.35e12 * a.memory)
    assert forward < scores_s


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_a_causal_mask_halves_the_work_but_not_the_time(kernel):
    sim = Simulation("H100 SXM", cluster="DGX H100", attention=kernel)
    with torch.device("meta"):
        q, k, v = (torch.empty(2, 16, 8192, 128, dtype=torch.bfloat16) for _ in range(3))
    full, causal = (attention_seconds(sim, q, k, v, mask, True) - sim.achieved.kernel_s
                    for mask in (False, True))
    # cuDNN's benchmark: 490.3 TFLOP/s causal (half the FLOPs) against 563.7 full
    assert causal / full == pytest.approx(0.5 * 563.7 / 490.3, rel=1e-3)
    assert 0.5 < causal / full < 0.6


def test_torch_2_11s_choice_of_kernel_cudnn_on_hopper_flash_on_ampere():
    assert Simulation("H100 SXM", cluster="DGX H100").attention == "cudnn"
    assert Simulation("A100 80GB", cluster="DGX A100").attention == "flash"
    assert Simulation("H100 SXM", "NVLink 4", attention="flash").attention == "flash"
    with pytest.raises(ValueError, match="attention='flash'"):
        Simulation("A100 80GB", cluster="DGX A100", attention="cudnn")
    with pytest.raises(ValueError, match="valid: flash, cudnn"):
        Simulation("H100 SXM", cluster="DGX H100", attention="fa3")


def test_cudnn_is_faster_than_flash_on_an_h100_for_16_bit_inputs_only():
    with torch.device("meta"):
        bf16 = [torch.empty(2, 16, 4096, 128, dtype=torch.bfloat16) for _ in range(3)]
        fp32 = [t.float() for t in bf16]
    times = {kernel: [attention_seconds(Simulation("H100 SXM", cluster="DGX H100",
                                                   attention=kernel), *qkv, False, False)
                      for qkv in (bf16, fp32)]
             for kernel in ("flash", "cudnn")}
    # the two calibration rows: 563.7 against 327.9 TFLOP/s
    assert times["flash"][0] / times["cudnn"][0] == pytest.approx(563.7 / 327.9, rel=0.01)
    assert times["flash"][1] == times["cudnn"][1]  # cuDNN runs no fp32 attention


def run_attention(rank, world_size, dropout):
    torch.manual_seed(1)
    q, k, v = qkv("cpu", length=64)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_results_and_gradients_are_torchs_own(dropout):
    plain = run_attention(0, 1, dropout)
    simulated, _ = dt.sim.one_rank(run_attention, 1, SIMULATIONS[0], args=(dropout,))
    for got, want in zip(simulated, plain):
        assert torch.equal(got, want)


def test_the_output_is_laid_out_as_flash_attention_lays_it_out():
    recorder = SimulatedRecorder(0, SIMULATIONS[0])
    q, k, v = qkv("cpu", length=16)
    with recorder.running():
        out = F.scaled_dot_product_attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous()  # (B, L, H, d) in memory
