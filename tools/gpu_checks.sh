#!/usr/bin/env bash
# The GPU checks, for a session that is lent a CUDA machine (never CI): CUDA graphs against
# eager token for token (the tests marked gpu, the TensorRT backend on real engines among them), then
# the bench on CUDA, then, where TensorRT is installed, the engine build and the TensorRT backend. Writes out/gpu/.
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
# Where TensorRT is installed: build the engines for this GPU's profile (ENGINE_PROFILE, else
# orin-fp16 on Orin and hopper-fp8 elsewhere) and run the TensorRT backend on them.
if $PY -c "import tensorrt, cuda.bindings.runtime" 2>/dev/null; then
    SM=$($PY -c "from cuda.bindings import runtime as rt; p = rt.cudaGetDeviceProperties(0)[1]; print(p.major * 10 + p.minor)")
    ENGINE_PROFILE=${ENGINE_PROFILE:-$([ "$SM" = 87 ] && echo orin-fp16 || echo hopper-fp8)}
    PLANNER=$($PY -c "from engines.profile import load_profile; print(load_profile('$ENGINE_PROFILE').planner)")
    $PY -m tools.cli engines build --profile "$ENGINE_PROFILE" --checkpoint checkpoints/tiny \
        --out out/gpu/engines-"$ENGINE_PROFILE" 2>&1 | tee out/gpu/engines_build.txt
    $PY -m tools.cli plan --engines out/gpu/engines-"$ENGINE_PROFILE" --backend tensorrt --profile "$PLANNER" \
        --scenes 8 --out out/gpu/plan_tensorrt 2>&1 | tee out/gpu/plan_tensorrt.txt
else
    echo "TensorRT or cuda-python not installed: the engine build and the TensorRT backend are skipped" \
        | tee out/gpu/tensorrt_skipped.txt
fi
