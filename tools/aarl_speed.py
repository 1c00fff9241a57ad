"""Seconds per AARL step of a config, the optimiser left out (rollouts, rewards, backward), on
one thread: `python tools/aarl_speed.py --config configs/train/aarl.yaml --steps 6 [--set K=V]`.

Run as a file, it measures whichever checkout PYTHONPATH names (PYTHONPATH=/path/to/other/checkout
times another version's step on the same scenes and seeds). Prints s/step, steps/s and the losses.
"""
from __future__ import annotations

import argparse
import time

import torch

from tools.argtypes import integer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="aarl_speed")
    p.add_argument("--config", default="configs/train/aarl.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=integer, default=6)
    p.add_argument("--label", default="")
    args = p.parse_args(argv)
    from models import io
    from scenes import dataset
    from train import aarl, config, data

    torch.set_num_threads(1)
    cfg = config.load("aarl", args.config, args.set)
    tok, mcfg, target, expert = io.load_planner(cfg.target)
    _, policy, _ = io.load_draft(cfg.draft, mcfg, target)
    ref = policy.frozen_copy()
    policy.train()
    examples = data.load_examples(cfg.data, tok, mcfg.target.vision)
    scenes = dataset.load(cfg.data.dir, cfg.data.split)
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        idx = data.batch_indices(len(examples), cfg.run.batch_size, step, cfg.run.seed, 0, 1)
        items = [(examples[i], scenes[int(examples[i].index)]) for i in idx]
        loss, _ = aarl.aarl_step(policy, ref, target, expert, items, tok, cfg, step)
        loss.backward()
        losses.append(round(float(loss.detach()), 4))
    s = (time.perf_counter() - t0) / args.steps
    print(f"{args.label} s/step {s:.3f} steps/s {1 / s:.4f} losses {losses}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
