"""Resumable training state: weights, optimiser moments and the step, as safetensors + JSON.

    RUN/state/
      <module>.safetensors   weights of each trained module
      optim.safetensors      AdamW moments, "<param index>.<key>" (exp_avg, exp_avg_sq, step)
      state.json             step, param_groups (lr, betas, ...), the stage config, log tail

A new state is written to `state.tmp/` and renamed over `state/`, so a run killed mid-write
resumes from the previous complete state. Nothing else is needed to resume: data order and all
training randomness are functions of (seed, step, scene index) (see train.data.sample_rng).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import safetensors.torch
import torch

STATE = "state"


def save(out, modules: dict, optimizer: torch.optim.Optimizer, step: int, extra: dict) -> Path:
    out = Path(out)
    tmp, final = out / f"{STATE}.tmp", out / STATE
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, module in modules.items():
        weights = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
        safetensors.torch.save_file(weights, str(tmp / f"{name}.safetensors"))
    opt = optimizer.state_dict()
    moments = {f"{i}.{key}": torch.as_tensor(v).detach().clone()
               for i, s in opt["state"].items() for key, v in s.items()}
    safetensors.torch.save_file(moments, str(tmp / "optim.safetensors"))
    body = {"step": step, "param_groups": opt["param_groups"], **extra}
    (tmp / "state.json").write_text(json.dumps(body, indent=1) + "\n")
    old = out / f"{STATE}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load(out, modules: dict, optimizer: torch.optim.Optimizer) -> tuple[int, dict]:
    """Restore `modules` and `optimizer` from RUN/state; returns (step, state.json). Step 0 and {}
    when there is no state yet."""
    folder = Path(out) / STATE
    if not (folder / "state.json").is_file():
        return 0, {}
    body = json.loads((folder / "state.json").read_text())
    for name, module in modules.items():
        file = folder / f"{name}.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: missing; the state in {folder} does not match this run's modules")
        module.load_state_dict(safetensors.torch.load_file(str(file)), strict=True)
    moments = safetensors.torch.load_file(str(folder / "optim.safetensors"))
    state: dict = {}
    for key, value in moments.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": body["param_groups"]})
    return int(body["step"]), body
