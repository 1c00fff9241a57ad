#!/usr/bin/env bash
# Every GPU measurement the open GPU issues ask for, in one run under 8 minutes on one GPU (never CI;
# each step has its own time limit, 595 s in all):
#   1. the tests marked gpu (CUDA graphs against eager token for token, the device-resident step)
#   2. the bench on CUDA with graphs (8 scenes x 2 repeats, seed 0): per mode the path its steps
#      took, host syncs a step, the host's share, and each call kind in the loop against its floor
#   2b. the same at k = 8 with the kv buckets off (attention over every cache row)
#   3. the same bench eager (what the host costs when nothing is graphed)
#   4. whole drives on CUDA (2 test drives)
#   5. `specdrive profile --device cuda`: a cycle's timeline with host calls and kernels
#   6. the kernels' floor at real sizes and the roofline against it (tools/gpu_checks_kernels.sh)
#   7. where TensorRT is installed, the engine build and the TensorRT backend
# Writes $OUT (the device machine's output folder), else out/gpu. On the device machine:
#   PY=python3 bash tools/gpu_checks.sh        (torch with CUDA, no venv: PYTHONPATH=. is set here)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-out/gpu}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
step() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.txt"; }
quiet() { grep -v "bench cycles\|it/s\]$" ; }

step "device"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
    2>&1 | tee "$OUT/device.txt" || exit 1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

step "1. tests marked gpu"
timeout 110 $PY -m pytest -rs -q -m gpu tests 2>&1 | tail -40 | tee "$OUT/pytest_gpu.txt"

step "2. bench, CUDA graphs"
timeout 100 $PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --scenes 8 --repeats 2 --seed 0 \
    --threads 0 --json "$OUT/bench_cuda.json" 2>&1 | quiet | tee "$OUT/bench_cuda.txt"

step "2b. bench, CUDA graphs, kv buckets off (every call over all max_len cache rows: the A/B of 2)"
timeout 50 $PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --no-kv-buckets --scenes 8 --repeats 2 \
    --seed 0 --ks 8 --no-adaptive --threads 0 --json "$OUT/bench_cuda_full_kv.json" 2>&1 | quiet | tee "$OUT/bench_cuda_full_kv.txt"

step "3. bench, eager CUDA"
timeout 60 $PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --eager --scenes 8 --repeats 2 --seed 0 \
    --ks 8 --no-adaptive --threads 0 --json "$OUT/bench_cuda_eager.json" 2>&1 | quiet | tee "$OUT/bench_cuda_eager.txt"

step "4. whole drives, CUDA graphs"
[ -d "$OUT/drives" ] || $PY -m tools.cli scenes generate --drives 2 --split test --seconds 8 --seed 0 \
    --out "$OUT/drives" > "$OUT/drives_generate.txt" 2>&1
timeout 90 $PY -m tools.cli bench --checkpoint checkpoints/tiny --device cuda --drives "$OUT/drives" --drive-count 2 \
    --modes plain+vision,spec,spec+vision,spec+vision+lookup,spec+vision+stream,spec+vision+lookup+stream \
    --drafts flat --threads 0 --json "$OUT/drives_cuda.json" 2>&1 | quiet | tee "$OUT/drives_cuda.txt"

step "5. profile, CUDA"
timeout 45 $PY -m tools.cli profile --checkpoint checkpoints/tiny --device cuda --cycles 4 --no-nsys \
    --out "$OUT/profile" 2>&1 | tail -30 | tee "$OUT/profile.txt"

if [ -f tools/gpu_checks_kernels.sh ]; then
    step "6. kernels at real sizes, roofline"
    OUT="$OUT" PY=$PY timeout 140 bash tools/gpu_checks_kernels.sh 2>&1 | tail -60 | tee "$OUT/kernels.txt"
fi

if $PY -c "import tensorrt, cuda.bindings.runtime" 2>/dev/null; then
    step "7. TensorRT"
    SM=$($PY -c "from cuda.bindings import runtime as rt; p = rt.cudaGetDeviceProperties(0)[1]; print(p.major * 10 + p.minor)")
    ENGINE_PROFILE=${ENGINE_PROFILE:-$([ "$SM" = 87 ] && echo orin-fp16 || echo hopper-fp8)}
    PLANNER=$($PY -c "from engines.profile import load_profile; print(load_profile('$ENGINE_PROFILE').planner)")
    $PY -m tools.cli engines build --profile "$ENGINE_PROFILE" --checkpoint checkpoints/tiny \
        --out "$OUT/engines-$ENGINE_PROFILE" 2>&1 | tee "$OUT/engines_build.txt"
    $PY -m tools.cli plan --engines "$OUT/engines-$ENGINE_PROFILE" --backend tensorrt --profile "$PLANNER" \
        --scenes 8 --out "$OUT/plan_tensorrt" 2>&1 | tee "$OUT/plan_tensorrt.txt"
else
    echo "TensorRT or cuda-python not installed: the engine build and the TensorRT backend are skipped" \
        | tee "$OUT/tensorrt_skipped.txt"
fi
step "done"
