"""Simulated training runs of published configurations (for sim_vs_published).

Each function returns the published run's figure of merit (images/s,
sequences/s, tokens/s per GPU) as the simulator gives it. Models are built
on the meta device in the dtype the run computed in (16-bit where it used
AMP: autocast does not reach meta tensors, so the whole model is cast).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ddp_teach as dt
from ddp_teach.models import resnet50
from ddp_teach.sim import Simulation
from ddp_teach.sim.schedules import predict
from ddp_teach.sim.runtime.recorder import SimulatedRecorder
from published_models import Bert, Llama, LlamaBlock, Mpt, MptBlock, bert_loss, \
    llama_loss, mpt_loss


def _profile_seconds(model, loss_of, simulation, optimizer=None) -> tuple:
    """(forward + backward, optimizer step) seconds of one step on one
    simulated device."""
    prof = predict.profile(model, loss_of, simulation)
    step_s = 0.0
    if optimizer is not None:
        clock = SimulatedRecorder(0, simulation)
        with clock.running():
            optimizer.step()
        step_s = clock.now()
    return prof, prof.forward_s + prof.backward_s, step_s


def resnet50_images_per_s(device: str, cluster, gpus: int, batch=256,
                          dtype=torch.half) -> float:
    """ResNet-50 v1.5 training, AMP (dtype=torch.float32: fp32, whose
    convolutions torch runs in TF32 where the GPU has it), `batch` images
    per GPU at 224 x 224, SGD with momentum; on `gpus` GPUs, torch's DDP
    schedule (25 MB buckets, each all-reduced as soon as it is full,
    `predict.bucketed_ddp`). cluster=None: one GPU, no network (achieved
    kernel rates all the same)."""
    if cluster is None and gpus > 1:
        raise ValueError("more than one GPU needs a cluster to talk over")
    model = resnet50(device="meta").to(dtype)
    x = torch.empty(batch, 3, 224, 224, device="meta", dtype=dtype)
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    sim = (Simulation(device, compute="achieved") if cluster is None
           else Simulation(device, cluster=cluster))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    prof, compute_s, step_s = _profile_seconds(
        model, lambda m: F.cross_entropy(m(x).float(), labels), sim, optimizer)
    step = predict.bucketed_ddp(prof, gpus) if gpus > 1 else compute_s
    return gpus * batch / (step + step_s)


def resnet50_inference_images_per_s(device: str, batch: int, dtype=torch.half) -> float:
    """ResNet-50 v1.5 inference on one GPU: `batch` images at 224 x 224, the
    model in eval mode (batch norm from its running statistics) under
    no_grad, fp16 for AMP (dtype=torch.float32: fp32)."""
    model = resnet50(device="meta").to(dtype).eval()
    x = torch.empty(batch, 3, 224, 224, device="meta", dtype=dtype)
    clock = SimulatedRecorder(0, Simulation(device, compute="achieved"))
    with torch.no_grad(), clock.running():
        model(x)
    return batch / clock.now()


def bert_sequences_per_s(gpus: int, accumulation: int, batch=256, length=128) -> float:
    """BERT-large pre-training phase 1 (128 tokens, 20 of them masked),
    fp16, `batch` sequences per GPU and micro-step, on DGX A100 nodes;
    gradients summed over `accumulation` micro-steps, then all-reduced in
    fp16 in one buffer after backward and a LAMB-like update (NVIDIA's
    "allreduce post accumulation"; Adam's update stands in for LAMB's)."""
    model = Bert().half().to("meta")
    tokens = torch.zeros(batch, length, dtype=torch.long, device="meta")
    masked = torch.arange(batch * 20, device="meta")
    sim = Simulation("A100 80GB", cluster="DGX A100")
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)
    _, micro_s, step_s = _profile_seconds(
        model, lambda m: bert_loss(m, tokens, masked), sim, optimizer)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    sync_s = predict.collective("all_reduce", grads, gpus, sim) if gpus > 1 else 0.0
    per_micro = micro_s + (sync_s + step_s) / accumulation
    return gpus * batch / per_micro


def _fsdp_step(rank, world_size, build, loss_of, inputs, micro_steps):
    with torch.device("meta"):
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        tokens = torch.zeros(*inputs, dtype=torch.long)
    for _ in range(2):  # the second step is kept
        dist.barrier()
        start = dt.tracing.now()
        for _ in range(micro_steps):
            loss_of(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
        took = dt.tracing.now() - start
    return took


def fsdp2_tokens_per_gpu_s(device, cluster, gpus, model, batch, length,
                           micro_steps=1) -> float:
    """Tokens per second per GPU of ZeRO-3 training of `model` ("llama3-8b",
    "mpt-7b", "mpt-13b") on `gpus` GPUs: the course's `dt.fsdp` (bf16
    compute, fp32 gradient reduction, each block a unit; AdamW) traced for
    rank 0 in this process, and the trace scheduled as torch's FSDP2
    overlaps it (`predict.fsdp2`). Attention runs FlashAttention-2's kernel,
    as in every published run here: llm-foundry's (its Triton flash kernel
    or flash-attn 2) and torchtitan's of December 2024 (torch 2.6, whose
    SDPA did not yet prefer cuDNN on H100)."""
    kinds = {"llama3-8b": (lambda: Llama(length=length, selective_checkpointing=True),
                           LlamaBlock, llama_loss),
             "mpt-7b": (Mpt, MptBlock, mpt_loss),
             "mpt-13b": (lambda: Mpt(layers=40, width=5120, heads=40), MptBlock,
                         mpt_loss)}
    make, block, loss_of = kinds[model]

    def build():
        return dt.fsdp.FullyShardedDataParallel(
            make(), units=lambda _name, m: isinstance(m, block), prefetch=False,
            compute_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    sim = Simulation(device, cluster=cluster, attention="flash")
    profile = predict.zero3_profile(_fsdp_step, gpus, sim,
                                    args=(build, loss_of, (batch, length), micro_steps))
    return micro_steps * batch * length / predict.fsdp2(profile, gpus, sim)
