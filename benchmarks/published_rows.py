"""The published measurements `sim_vs_published.py` sets the simulator
against: the collectives and kernels of `ddp_teach.sim.evidence.published` (which
appendix A3 shows the learner), and the training runs of
`ddp_teach/sim/evidence/training.toml` (each with its exact configuration,
its source, whether a constant of the simulator was solved from it
("calibrate") or it only checks them ("validate")), simulated here by the
functions each row names (`published_runs`, on the models of
`published_models`).
"""
import torch

from ddp_teach.sim.evidence import loader
from ddp_teach.sim.evidence.published import MEASUREMENTS
from ddp_teach.sim.model.simulation import Simulation

import published_runs as runs
from capstone_step import simulated_capstone

def _capstone_ms(width: int, heads: int, device="H100 SXM", cluster="DGX H100") -> float:
    """Notebook 10's DDP step on one simulated GPU of a node, as
    gpu_vs_sim.py runs it on a real one."""
    step = simulated_capstone(Simulation(device, cluster=cluster), width, heads)
    return step.summary()[0]["span_s"] * 1e3


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def resnet50_images_per_s(device, cluster=None, gpus=1, batch=256, dtype="float16",
                          tf32=True):
    """tf32=False: fp32 convolutions with TF32 off (cudnn.allow_tf32, which the
    simulator reads as torch does), as a run that turned it off."""
    allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        return runs.resnet50_images_per_s(device, cluster, gpus, batch, _dtype(dtype))
    finally:
        torch.backends.cudnn.allow_tf32 = allowed


def resnet50_ms_per_batch(device, batch, dtype="float16"):
    """Milliseconds of one training step of `batch` images on one GPU."""
    return batch * 1e3 / resnet50_images_per_s(device, None, 1, batch, dtype)


def resnet50_inference_images_per_s(device, batch, dtype="float16"):
    return runs.resnet50_inference_images_per_s(device, batch, _dtype(dtype))


# the functions the rows of training.toml name, with dtypes by name
SIMULATORS = {"resnet50_images_per_s": resnet50_images_per_s,
              "resnet50_ms_per_batch": resnet50_ms_per_batch,
              "resnet50_inference_images_per_s": resnet50_inference_images_per_s,
              "bert_sequences_per_s": runs.bert_sequences_per_s,
              "fsdp2_tokens_per_gpu_s": runs.fsdp2_tokens_per_gpu_s,
              "capstone_ms": _capstone_ms}
ROWS = MEASUREMENTS + loader.measurements(["training.toml"], SIMULATORS)
