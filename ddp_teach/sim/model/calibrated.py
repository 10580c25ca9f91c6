"""Every calibrated constant of the simulator, as plain numbers.

A leaf: this module imports nothing. Each constant was solved from the
published measurements named in `SOLVED_FROM`, by the ids of their rows in
`ddp_teach/sim/evidence/*.toml` (every row whose role is "calibrate" is
named here, and no other). The repository's `tools/calibrate.py` solves
each constant again from its rows and `--check` fails when a stored value
differs from what its rows give by more than rounding to the figures it is
written with; tests/sim/test_calibration.py runs it.

A constant solved from a row reproduces that row by construction; what
tells whether it can be trusted is every row it was not solved from (the
"validate" rows), which `ddp_teach.sim.evidence.published` and the repository's
`benchmarks/sim_vs_published.md` set beside the simulator.

How each was solved: most are roots of the simulated figure, rounded to
three figures. The memory and attention shares are the row's figure over
the datasheet peak (H100 SXM: 3.35 TB/s, 989.4 bf16 TFLOP/s; A100 80GB:
2.039 TB/s, 312 TFLOP/s), and CAUSAL the causal row's figure over the
full-mask one's: these leave out each kernel's fixed cost, so their rows
come back 0.03-0.2% low. A100's `matmul` and KERNEL_S come from two rows
together, KERNEL_S rounded first and `matmul` solved again with it; so do
LINK_FRACTIONS["nvls"] and NVLS_CHUNK_S.
"""

# GPU-side fixed seconds of one kernel, with `efficiency`'s tile model; every preset's
KERNEL_S = 3.74e-6
# the share of the fp32 peak fp32 convolutions reach on the CUDA cores, counted
# against a direct convolution's FLOPs (cuDNN's Winograd 3x3 kernels do fewer
# multiplications, so it can come near 1); on GPUs with 64 fp32 units per SM
# (Volta, Turing, the A100), solved on a V100
CONV_FP32 = 0.796
# the same share on GPUs whose fp32 peak counts 128 fp32 units per SM, half of
# them sharing issue slots with integer work (Hopper, Ada, Ampere's GA10x, by
# NVIDIA's architecture whitepapers; the V100 and A100 have 64): cuDNN's
# convolutions keep much less of that doubled peak. Solved on the course's
# own H200 (an H100's SMs), with TF32 off
CONV_FP32_DOUBLED = 0.379
# the share of its full-mask rate a fused attention kernel keeps with a causal mask
CAUSAL = 0.8698
# the share of the fp32 CUDA-core rate a 16-bit product keeps on a GPU without
# units for that type (bf16 on a T4 or a V100): converted, then computed in fp32
EMULATED = 0.59
# host seconds to issue one eager operation: about 7 us for a tiny elementwise op
# (flagos-ai/FlagGems issue 4812, "~7 us eager"); a round figure with no row,
# which the course's own row host-time-of-one-small-eager-op-ours validates
HOST_S_PER_OP = 7e-6
# compute overlapped with communication runs this much slower, the average over
# many runs on A100 and H100 (Lee et al., "Characterizing Compute-Communication
# Overlap in GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, 2025);
# no single row, so nothing to re-solve
OVERLAP_SLOWDOWN = 1.189

# Per GPU preset, the fields of `efficiency.Achieved`: the fractions of the
# datasheet peaks real kernels reach (`ddp_teach.sim.model.hardware` builds the
# presets' Achieved from these).
KERNEL_FRACTIONS = {
    "H100 SXM": dict(sms=132, matmul=0.851, memory=0.8866, attention=0.3314,
                     conv=0.398, kernel_s=KERNEL_S, sustained=0.679,
                     attention_cudnn=0.5697, matmul_fp32=0.779, conv_tf32=0.246,
                     conv_fp32=CONV_FP32_DOUBLED),
    "A100 80GB": dict(sms=108, matmul=0.815, memory=0.8337, attention=0.5753,
                      conv=0.398, kernel_s=KERNEL_S, sustained=0.877,
                      matmul_fp32=0.986, conv_tf32=0.246, conv_fp32=CONV_FP32),
}
# H100's conv and conv_tf32 are A100's (no H100 convolution run calibrates
# them; the course's H200 rows in AMP and TF32 check them, within 11%). V100,
# T4 and RTX 4090 take A100's other fractions with their own SM counts
# (datasheets: 80, 40 and 128 SMs), a stated assumption that the ResNet-50
# rows of V100 and T4 check; V100's fp32 products take A100's tensor-core
# fraction.
KERNEL_FRACTIONS["V100 SXM2"] = {**KERNEL_FRACTIONS["A100 80GB"], "sms": 80,
                                 "matmul_fp32": None}
KERNEL_FRACTIONS["T4"] = {**KERNEL_FRACTIONS["A100 80GB"], "sms": 40, "matmul": 0.645,
                          "matmul_fp32": 0.515}
KERNEL_FRACTIONS["RTX 4090"] = {**KERNEL_FRACTIONS["A100 80GB"], "sms": 128,
                                "matmul": 1.0, "matmul_fp32": 0.666,
                                "conv_fp32": CONV_FP32_DOUBLED}
# An H200 is an H100's chip with faster memory: it takes every H100 fraction
# (the memory share too: the same kind of memory controller, a share of a
# higher peak), which the course's own H200 rows (source "course-h200")
# check: copy 4.25 TB/s against 4.26 simulated, bf16 products, attention.
KERNEL_FRACTIONS["H200 SXM"] = dict(KERNEL_FRACTIONS["H100 SXM"])
# A B200 (Blackwell: 148 SMs of 128 fp32 units) has its own bf16 product
# share, solved from the best-shaped product measured on one; every other
# fraction is the H100's, an assumption no Blackwell row calibrates (its
# memory share is checked by one row): extrapolation.
KERNEL_FRACTIONS["B200"] = {**KERNEL_FRACTIONS["H100 SXM"], "sms": 148, "matmul": 0.811}
# which preset's fractions each copied preset took, field by field (the rest are its own)
COPIED_FROM = {"H100 SXM": ("A100 80GB", ("conv", "conv_tf32")),
               "H200 SXM": ("H100 SXM", tuple(KERNEL_FRACTIONS["H100 SXM"])),
               "B200": ("H100 SXM", tuple(f for f in KERNEL_FRACTIONS["H100 SXM"]
                                          if f not in ("sms", "matmul"))),
               "V100 SXM2": ("A100 80GB", ("memory", "attention", "conv", "conv_tf32",
                                           "sustained", "matmul")),
               "T4": ("A100 80GB", ("memory", "attention", "conv", "conv_tf32",
                                    "sustained")),
               "RTX 4090": ("A100 80GB", ("memory", "attention", "conv", "conv_tf32",
                                          "sustained"))}

# The fraction of NCCL's own bandwidth estimate a collective reaches, by the
# kind of algorithm (`ddp_teach.sim.model.comm.kind_of`): ring or tree inside one
# node, NVLink SHARP inside one node, ring or tree over the network, NVLS in
# each node with a tree between them, ring or tree inside a node through host
# memory (no peer-to-peer).
LINK_FRACTIONS = {"in node": 0.991, "nvls": 0.974, "across nodes": 0.907,
                  "nvls tree": 0.549, "host memory": 0.333}
# one NVLS chunk's fixed cost with every channel working, and with one alone
# (`ddp_teach.sim.model.comm` says how chunks are charged)
NVLS_CHUNK_S = 5.4e-6
NVLS_ONE_CHANNEL_S = 1.8e-6

# {constant: the ids of the evidence rows it was solved from}
SOLVED_FROM = {
    "H100 SXM: matmul": ("bf16-matmul-2048-x-2048-x-13312-h100",),
    "B200: matmul": ("bf16-matmul-1792-x-16128-x-3072-b200",),
    "A100 80GB: matmul": ("fp16-matmul-8192-cubed-a100", "fp16-matmul-1024-cubed-a100"),
    "KERNEL_S": ("fp16-matmul-1024-cubed-a100", "fp16-matmul-8192-cubed-a100"),
    "H100 SXM: memory": ("stream-triad-h100",),
    "A100 80GB: memory": ("stream-triad-a100",),
    "H100 SXM: attention": ("flashattention-2-h100",),
    "A100 80GB: attention": ("flashattention-2-a100",),
    "H100 SXM: attention_cudnn": ("cudnn-attention-fwd-plus-bwd-h100",),
    "CAUSAL": ("cudnn-attention-fwd-plus-bwd-causal-h100",
               "cudnn-attention-fwd-plus-bwd-h100"),
    "H100 SXM: matmul_fp32": ("fp32-square-matmul-best-size-h100",),
    "A100 80GB: matmul_fp32": ("fp32-square-matmul-best-size-a100",),
    "T4: matmul": ("fp16-square-matmul-best-size-t4-colab",),
    "T4: matmul_fp32": ("fp32-square-matmul-best-size-t4-colab",),
    "EMULATED": ("bf16-square-matmul-best-size-t4-colab",),
    "RTX 4090: matmul": ("fp16-square-matmul-best-size-rtx-4090-a",),
    "RTX 4090: matmul_fp32": ("fp32-square-matmul-best-size-rtx-4090-a",),
    "H100 SXM: sustained": ("mpt-7b-fsdp-8-h100",),
    "A100 80GB: sustained": ("mpt-7b-fsdp-8-a100",),
    "A100 80GB: conv": ("resnet-50-1-a100",),
    "A100 80GB: conv_tf32": ("resnet-50-tf32-1-a100",),
    "CONV_FP32": ("resnet-50-fp32-1-v100",),
    "CONV_FP32_DOUBLED": ("resnet-50-fp32-tf32-off-1-h200-ours",),
    "LINK_FRACTIONS['in node']": ("all-reduce-16-gib-8-gpus-ring",),
    "LINK_FRACTIONS['nvls']": ("all-reduce-8-gib-8-gpus-nvls", "all-reduce-64-mib-8-gpus-nvls"),
    "NVLS_CHUNK_S": ("all-reduce-64-mib-8-gpus-nvls", "all-reduce-8-gib-8-gpus-nvls"),
    "NVLS_ONE_CHANNEL_S": ("all-reduce-128-kib-8-gpus-nvls",),
    "LINK_FRACTIONS['across nodes']": ("all-reduce-32-gpus-in-4-nodes",),
    "LINK_FRACTIONS['nvls tree']": ("all-reduce-512-mib-16-gpus-in-2-nodes",),
    "LINK_FRACTIONS['host memory']": ("all-reduce-1-gib-2-gpus-pcie-3-no-p2p",),
}
