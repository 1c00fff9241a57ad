#!/usr/bin/env bash
# The runs behind docs/claims.md (`make claims`): five seeds of every distilled draft, AARL on each
# flat seed with the shipped recipe, then the evaluation (200 scenes per split). The reward-weight x
# KL ablation of AARL (action_on: one_pass), run on an earlier target, is not part of it; its
# commands are in docs/claims.md.
# A stage is skipped only when its draft's meta.json records the current target's weights
# (target_sha256): a re-run over an old runs/ folder trains again what a new target made stale.
set -euo pipefail
PY=${PY:-.venv/bin/python}
TARGET=checkpoints/tiny      # the shipped target (its SFT run's weights): no `make train` needed
current() { $PY -m train.current "$1" $TARGET; }
current runs/claims-distill/flat-standalone-s4/ckpt/draft-flat-standalone && \
current runs/claims-distill/mrope-standalone-s4/ckpt/draft-mrope-standalone || \
  $PY -m tools.cli train distill --config configs/train/distill-claims.yaml
aarl() {  # NAME SEED [overrides...]
  local name=$1 seed=$2; shift 2
  current runs/claims-aarl/$name/ckpt/draft-flat-aarl && return 0
  $PY -m tools.cli train aarl --config configs/train/aarl.yaml --set target=$TARGET \
    --set draft=runs/claims-distill/flat-s$seed/ckpt/draft-flat --set run.seed=$seed \
    --set run.out=runs/claims-aarl/$name "$@"
}
for s in 0 1 2 3 4; do aarl rollout-s$s $s; done
$PY -m tools.cli train eval --config configs/train/eval-claims.yaml
