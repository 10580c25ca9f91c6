"""Record a torch.profiler trace of a real DDP job over NCCL on this machine's
GPU, to keep as a test asset for `ddp_teach.tracing.torch_profiler`.

    python tools/record_gpu_trace.py OUT_DIR [--ranks N]

Each rank (one process per GPU; N defaults to the GPU count) trains a small
MLP in `DistributedDataParallel` (1 MiB buckets, so several all-reduces a
step), warms up for two steps, then profiles two with
`activities=[CPU, CUDA]` and `record_shapes=True`, and writes
`OUT_DIR/nccl_ddp_rank<r>.json.gz` (Kineto's Chrome trace, gzipped) and a
line per rank to `OUT_DIR/trace_summary.txt`: the GPU, torch's and NCCL's
versions, and how many kernels and which NCCL kernels the trace holds.

With `--ranks` above the GPU count the ranks share GPUs; NCCL refuses that
("Duplicate GPU detected", init.cc), and the script records the refusal in
the summary instead of a trace: the asset then says what one GPU can show.
Everything listens on 127.0.0.1; a rank that hangs is killed after 120 s.
"""
import argparse
import gzip
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

WIDTH, DEPTH, BATCH = 1024, 4, 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, world: int, port: int, out: str):
    summary = Path(out) / f"trace_summary_rank{rank}.txt"
    try:
        gpu = rank % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world,
                                device_id=torch.device("cuda", gpu))
        torch.manual_seed(0)
        layers = []
        for _ in range(DEPTH):
            layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
        model = DDP(torch.nn.Sequential(*layers).cuda(), bucket_cap_mb=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(BATCH, WIDTH, device="cuda")

        def step():
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        raw = Path(out) / f"nccl_ddp_rank{rank}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        with gzip.open(f"{raw}.gz", "rt") as f:
            events = json.load(f)["traceEvents"]
        kernels = [e["name"] for e in events if isinstance(e, dict)
                   and e.get("cat") == "kernel"]
        nccl = sorted({n for n in kernels if n.startswith("nccl")})
        collectives = sorted({e["name"] for e in events if isinstance(e, dict)
                              and e.get("name", "").startswith("nccl:")})
        summary.write_text(
            f"rank {rank}/{world} on {torch.cuda.get_device_name(gpu)}: torch "
            f"{torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; "
            f"{len(events)} events, {len(kernels)} kernels, NCCL kernels "
            f"{nccl or 'none'}, collective ops {collectives or 'none'}\n")
        dist.destroy_process_group()
    except Exception as error:  # the refusal is the finding: write it down
        summary.write_text(f"rank {rank}/{world}: {type(error).__name__}: {error}\n")
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here: this records a GPU trace")
    world = args.ranks or torch.cuda.device_count()
    os.makedirs(args.out, exist_ok=True)
    context = mp.start_processes(rank_main, args=(world, free_port(), args.out),
                                 nprocs=world, join=False, start_method="spawn")
    try:
        deadline = time.monotonic() + 120
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                print(f"{world} ranks: not done after 120 s; killed")
                break
    except Exception as error:
        print(f"{world} ranks: {type(error).__name__}: {str(error)[-400:]}")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    lines = sorted(Path(args.out).glob("trace_summary_rank*.txt"))
    with open(Path(args.out) / "trace_summary.txt", "a") as summary:
        for line in lines:
            summary.write(line.read_text())
            line.unlink()
    print((Path(args.out) / "trace_summary.txt").read_text())


if __name__ == "__main__":
    main()
