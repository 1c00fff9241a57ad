"""FP8 post-training calibration of the target LLM and the draft in torch, with NVIDIA ModelOpt.

    scenes, sha = calibration_set(n, seed)               train-split scenes and their sha256
    amax = fp8_amax(cfg, target, expert, draft, tok, scenes, planner_cfg)
        -> {"target": {linear: {"input": a, "weight": w}}, "draft": {...}}   (per-tensor amax)

The forward loop is the real one: a planner cycle per scene on the torch backend (vision,
prefill, draft chains, verify widths 1..k+1, the expert), so the activations are those an engine
sees. `mtq.quantize(models, FP8_DEFAULT_CFG, loop)` inserts E4M3 fake quantizers with max
calibrators in front of every nn.Linear (input and weight) and runs the loop in calibration mode;
ModelOpt 0.47 does this on CPU (the quantizers only record amax here). The vision tower and the
LM head are left out (ModelOpt's default config disables "*visual*" and "*lm_head*"); the models
passed in are not changed (a copy is quantized). FP8 scales are amax / 448 (E4M3's largest value),
computed by the writer (engines/trtllm.py).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib

import numpy as np
import torch

from calibration.scenes import SPLIT, CalibrationScene, calibration_scenes
from core.config import ConfigError
from runtime.config import BudgetConfig, with_overrides


def calibration_set(n: int, seed: int = 0) -> tuple[list[CalibrationScene], str]:
    """`n` train-split scenes and the sha256 of what they hold (names, images, histories)."""
    scenes = calibration_scenes(n, seed)
    return scenes, scenes_sha256(scenes)


def scenes_sha256(scenes: list[CalibrationScene]) -> str:
    h = hashlib.sha256(f"{SPLIT}:{len(scenes)}".encode())
    for s in scenes:
        h.update(s.name.encode())
        h.update(np.ascontiguousarray(s.images).tobytes())
        h.update(np.ascontiguousarray(s.history, np.float32).tobytes())
    return h.hexdigest()


def fp8_amax(cfg, target, expert, draft, tokenizer, scenes: list[CalibrationScene], planner_cfg,
             progress=lambda *_: None) -> dict:
    """Per-tensor amax of every calibrated nn.Linear's input and weight, by model and module name
    (our names: "layers.0.self_attn.q_proj"). A cycle that fails is an error, not a quiet gap."""
    try:
        import modelopt.torch.quantization as mtq
    except ImportError:
        raise ConfigError("FP8 calibration needs NVIDIA ModelOpt: pip install -e '.[quant]' "
                          "(nvidia-modelopt>=0.27)") from None
    from runtime.backends.torch import TorchBackend
    from runtime.planner import Planner

    # one deepcopy of both keeps the draft's shared embedding / LM head pointing at the copy
    t, d = copy.deepcopy((target, draft))
    models = torch.nn.ModuleDict({"target": t, "draft": d})
    # no budget: every cycle reasons to <|cot_end|> (or the token cap), whatever this CPU's speed; a
    # fixed k: adaptive k follows measured times, and the verify blocks (so the amax) would follow
    # how busy the machine was
    pcfg = with_overrides(planner_cfg, {"budget": dataclasses.asdict(BudgetConfig()), "fallback": "inline",
                                        "spec": {"adaptive": False}}, "fp8 calibration")

    def loop(_):
        backend = TorchBackend(cfg, t, expert, d, "routine", "cpu", pcfg.max_len)
        planner = Planner(backend, tokenizer, pcfg)
        for i, s in enumerate(scenes):
            res = planner.plan(s.images, s.history, scene=s.name)
            if res.error:
                raise RuntimeError(f"calibration cycle on {s.name} failed: {res.error}")
            progress(f"calibration {i + 1}/{len(scenes)}: {s.name}")

    with torch.no_grad():
        mtq.quantize(models, copy.deepcopy(mtq.FP8_DEFAULT_CFG), loop)
    return {name: _amax(models[name]) for name in ("target", "draft")}


def _amax(model: torch.nn.Module) -> dict:
    out = {}
    for name, mod in model.named_modules():
        iq, wq = getattr(mod, "input_quantizer", None), getattr(mod, "weight_quantizer", None)
        if iq is None or not iq.is_enabled or iq.amax is None:
            continue
        out[name] = {"input": float(iq.amax), "weight": float(wq.amax)}
    return out
