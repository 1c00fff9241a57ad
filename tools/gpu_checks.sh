#!/usr/bin/env bash
# The GPU checks, for a session that is lent a CUDA machine (never CI): CUDA graphs against
# eager token for token (the tests marked gpu), then the bench on CUDA. Writes out/gpu/.
# Usage: bash tools/gpu_checks.sh    (after `make install`; takes a few minutes on one GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p out/gpu
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'; print(torch.cuda.get_device_name())"
$PY -m pytest -rs -q -m gpu tests 2>&1 | tee out/gpu/pytest_gpu.txt
$PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --scenes 8 --repeats 2 \
    --threads 0 --json out/gpu/bench_cuda.json 2>&1 | grep -v "bench cycles" | tee out/gpu/bench_cuda.txt
$PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --eager --scenes 8 --repeats 2 \
    --threads 0 --json out/gpu/bench_cuda_eager.json 2>&1 | grep -v "bench cycles" | tee out/gpu/bench_cuda_eager.txt
