#!/usr/bin/env bash
# The course's GPU checks in one command, for a machine with CUDA GPUs whose
# python3 already holds a CUDA torch (a cloud GPU box, Kaggle, the lent GPU
# machines of this project's workplace): the course runs from this checkout
# (PYTHONPATH, nothing installed over that torch), then
#   1. benchmarks/gpu_vs_sim.py (`make bench-gpu`: this machine's GPUs against
#      the simulator's prediction for them),
#   2. tools/record_gpu_trace.py: a torch.profiler trace of a DDP job over
#      NCCL, one rank per GPU (the test asset of tests/tracing/data); on a
#      one-GPU machine also two ranks on that GPU, to record NCCL's refusal,
#   3. tests/gpu (`make test-gpu`'s tests: the nccl and CUDA paths, and
#      every notebook top to bottom, 01, 03 and 05 first), last because it
#      takes longest: TESTS_TIMEOUT seconds (default 480) cuts it short.
# Logs, traces and benchmarks/gpu_vs_sim.md go to $OUT, or ./gpu-check.
#
# Packages the course needs that such a machine may lack (the notebook test
# needs nbformat, nbclient, ipykernel, ipython and what they need) can be
# carried as wheels in .whl/ (ignored by git): they are installed into
# /tmp/site first. Without them the notebook test is skipped with its reason.
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
# the host issues every kernel: its speed is in the numbers
{ nvidia-smi; lscpu; } >"$out/machine.txt" 2>&1
python3 -c "import sys, torch, ddp_teach
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])" \
    2>&1 | tee -a "$out/machine.txt"
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/gpu_vs_sim.py 2>&1 | tee "$out/bench-gpu.log"
bench=${PIPESTATUS[0]}
cp benchmarks/gpu_vs_sim.md "$out/" 2>/dev/null
timeout 150 python3 tools/record_gpu_trace.py "$out" 2>&1 | tail -20
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" = 1 ]; then
    mkdir -p "$out/two_ranks_one_gpu"
    timeout 150 python3 tools/record_gpu_trace.py "$out/two_ranks_one_gpu" --ranks 2 2>&1 | tail -20
fi
# addopts cleared: pyproject's name nbval's options, and nbval is not needed
# here; the notebooks side by side where pytest-xdist is there
parallel=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TESTS_WORKERS:-4}")
timeout ${TESTS_TIMEOUT:-480} python3 -m pytest -o addopts="" $parallel -m gpu -rs \
    -p no:cacheprovider --durations=0 tests/gpu 2>&1 | tee "$out/test-gpu.log"
tests=${PIPESTATUS[0]}
echo "tests/gpu exit $tests, gpu_vs_sim exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
