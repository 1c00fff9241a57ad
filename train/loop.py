"""The one training loop every stage uses: AdamW, warmup + cosine, gradient averaging over
ranks, clipping, a progress bar, JSON-lines logs and resumable wall-clock checkpoints.

    fit(run, modules, step_fn, world, on_checkpoint) -> final step

`step_fn(step) -> (loss, logs)` builds this rank's loss for global step `step` (its data and
randomness are functions of the step, so a resumed run repeats exactly what it would have done).
`on_checkpoint(step)` (rank 0) writes the stage's shippable checkpoint next to the state.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from core.config import ConfigError
from train import dist, state
from train.config import RunConfig


def device(name: str) -> torch.device:
    """A stage's device: "cpu", or "cuda" (the first visible GPU), refused where torch sees none."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda': torch sees no CUDA GPU on this machine; use device cpu")
    return torch.device(name)


def lr_at(step: int, run: RunConfig) -> float:
    """Linear warmup to run.lr over run.warmup steps, then cosine to run.lr * min_lr_ratio."""
    if step < run.warmup:
        return run.lr * (step + 1) / run.warmup
    span = max(run.steps - run.warmup, 1)
    progress = min((step - run.warmup) / span, 1.0)
    floor = run.lr * run.min_lr_ratio
    return floor + (run.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(params: list, run: RunConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm gains and biases are not decayed)."""
    decay = [p for p in params if p.dim() >= 2]
    keep = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": run.weight_decay},
              {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=run.lr, betas=(0.9, 0.95), eps=1e-8)


class Log:
    """Rank 0 appends averaged metrics to RUN/log.jsonl every run.log_every steps."""

    def __init__(self, out: Path, every: int, main: bool):
        self.file, self.every, self.main = out / "log.jsonl", max(every, 1), main
        self.sums: dict[str, float] = {}
        self.n = 0
        self.t0 = time.monotonic()

    def add(self, step: int, logs: dict, world: dist.World) -> dict:
        for k, v in logs.items():
            self.sums[k] = self.sums.get(k, 0.0) + dist.mean_scalar(v, world)
        self.n += 1
        if (step + 1) % self.every or not self.n:
            return {}
        row = {"step": step + 1, **{k: round(v / self.n, 5) for k, v in self.sums.items()},
               "elapsed_s": round(time.monotonic() - self.t0, 1)}
        self.sums, self.n = {}, 0
        if self.main:
            with self.file.open("a") as f:
                f.write(json.dumps(row) + "\n")
        return row


def fit(run: RunConfig, modules: dict, step_fn: Callable, world: dist.World,
        on_checkpoint: Callable | None = None, extra: dict | None = None) -> int:
    """Train the parameters of `modules` that require grad, from the saved state if any."""
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    opt = make_optimizer(params, run)
    start, _ = state.load(out, modules, opt)
    if start == 0:
        dist.broadcast_parameters(modules.values(), world)
    log = Log(out, run.log_every, world.main)
    last_save = time.monotonic()
    bar = tqdm(range(start, run.steps), initial=start, total=run.steps, disable=not world.main,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, file=sys.stderr)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, run)
        loss, logs = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        dist.average_gradients(params, world)
        gnorm = torch.nn.utils.clip_grad_norm_(params, run.grad_clip if run.grad_clip else float("inf"))
        opt.step()
        row = log.add(step, {"loss": float(loss.detach()), **logs, "grad_norm": float(gnorm)}, world)
        if row:
            bar.set_postfix({k: row[k] for k in list(row)[:4] if k != "step"})
        if run.ckpt_every_s and time.monotonic() - last_save > run.ckpt_every_s and step + 1 < run.steps:
            _checkpoint(out, modules, opt, step + 1, world, on_checkpoint, extra)
            last_save = time.monotonic()
    _checkpoint(out, modules, opt, run.steps, world, on_checkpoint, extra)
    return run.steps


def _checkpoint(out, modules, opt, step, world, on_checkpoint, extra) -> None:
    if world.main:
        state.save(out, modules, opt, step, dict(extra or {}))
        if on_checkpoint is not None:
            on_checkpoint(step)
    dist.barrier(world)
