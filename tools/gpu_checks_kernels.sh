#!/usr/bin/env bash
# The measured floor on a GPU (issue 48), for a session that is lent a CUDA machine: the decode step,
# verify widths, draft steps, prefill and expert draws of tiny, edge-2b and alpamayo-r1-10b in bf16
# with CUDA graphs (tools/measure_c.py --floor), edge-2b's reference path and an 8,192-row cache
# beside them, then `specdrive roofline --measured` at edge-2b and alpamayo-r1-10b on the H200; first the
# GPU test of tests/test_inference_path.py (graph replays against the eager reference) where pytest is installed.
# Writes $OUT/kernels/ (default out/gpu/kernels). Takes about 3 minutes on one H200.
# Usage: PYTHONPATH=. bash tools/gpu_checks_kernels.sh    (PY=python3 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.}
D=${OUT:-out/gpu}/kernels
mkdir -p "$D"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'; print(torch.cuda.get_device_name(), torch.__version__)" | tee "$D/device.txt"
# the inference path under CUDA graphs against the eager masked reference, on this GPU (fp32 and bf16)
if $PY -c "import pytest" 2>/dev/null; then
    $PY -m pytest -q -rs -m gpu tests/test_inference_path.py 2>&1 | tee "$D/pytest_inference_path.txt" \
        || echo "FAILED: the GPU test of tests/test_inference_path.py (above); measuring on" | tee -a "$D/pytest_inference_path.txt"
else
    echo "pytest not installed: tests/test_inference_path.py's GPU test skipped" | tee "$D/pytest_inference_path.txt"
fi
W=1-9,12,16,17,24,33,48,65
floor() {   # NAME PRESET ARGS...: one floor, its table on stdout and in NAME.txt, its record in NAME.json
    local name=$1; shift
    $PY -m tools.measure_c --floor --device cuda --dtype bf16 --json "$D/$name.json" "$@" 2>&1 | tee "$D/$name.txt" \
        || echo "FAILED: floor $name (above)" | tee -a "$D/$name.txt" "$D/failures.txt"
}
floor tiny --preset tiny --max-len 512 --cached 300 --widths $W --images 8
floor edge-2b --preset edge-2b --max-len 2048 --cached 1200 --widths $W --images 8 --image-hw 320 576
floor edge-2b-reference --preset edge-2b --max-len 2048 --cached 1200 --widths 1,9,65 --images 8 \
    --image-hw 320 576 --path reference
floor edge-2b-8192 --preset edge-2b --max-len 8192 --cached 1200 --widths 1,9 --images 8 --image-hw 320 576
floor alpamayo-r1-10b --preset alpamayo-r1-10b --max-len 4096 --cached 2500 --widths $W --images 16 \
    --image-hw 320 576 --runs 20
for p in edge-2b alpamayo-r1-10b; do
    $PY -m tools.cli roofline --preset $p --device h200 --precision bf16 --measured "$D/$p.json" \
        --trees "16,8,4;32,8,8;64,8,8" --json "$D/roofline-$p.json" 2>&1 | tee "$D/roofline-$p.txt" \
        || echo "FAILED: roofline $p (above)" | tee -a "$D/roofline-$p.txt" "$D/failures.txt"
done
