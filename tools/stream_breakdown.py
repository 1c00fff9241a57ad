"""Where a streaming prefill's time goes: the torch backend's calls timed cycle by cycle on one
drive, for a planner that prefills in full and one that streams (reuse.prefill), each alone.

    python -m tools.stream_breakdown [--checkpoint checkpoints/tiny] [--drive-seed 11] [--cycles 20]
                                     [--skip 5] [--threads 1]

Prints one JSON line per planner: the median ms of each timed call over the cycles after the first
`--skip` (the first 5 cycles of a drive keep no frame), and the prompt's rows. The calls:
`prefill` (full), `image_blocks` (the new frames' blocks, one call), `prefill_streamed` (the rows
around the images, the kept blocks written, the draft's prompt), inside it `write_image_blocks`
(the kept keys rotated) and `draft_prompt` (the draft's prompt rows, in both planners).
Needs a frame_local checkpoint; docs/bench.md "Streaming prefill on whole drives" cites it.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time

from tools.argtypes import count


def timed(calls: dict, obj, name: str, key: str) -> None:
    """Replace obj.name by a wrapper that appends each call's ms to calls[key]."""
    f = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        calls[key].append((time.perf_counter() - t) * 1e3)
        return out
    setattr(obj, name, wrapper)


def breakdown(checkpoint: str, drive_seed: int, cycles: int, skip: int, stream: bool) -> dict:
    import numpy as np

    import runtime.backends.torch as torch_backend
    from runtime.artifacts import ModelSource, open_backend
    from runtime.config import ReuseConfig, load_planner_config
    from runtime.planner import Planner
    from scenes.config import DT, FRAME_OFFSETS
    from scenes.world import make_drive

    cfg = load_planner_config("cpu")
    cfg = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, budget_ms=0.0),
                              reuse=ReuseConfig(vision=True, prefill=stream))
    be, tok = open_backend(ModelSource(checkpoint=checkpoint), cfg.max_len, k_max=cfg.spec.k_max)
    calls = collections.defaultdict(list)
    for name in ("prefill", "image_blocks", "prefill_streamed"):
        timed(calls, be, name, name)
    timed(calls, be, "_draft_prefill", "draft_prompt")
    saved = torch_backend.write_image_blocks
    timed(calls, torch_backend, "write_image_blocks", "write_image_blocks")
    planner, rows = Planner(be, tok, cfg), 0
    try:
        for c in make_drive(drive_seed, None, "test", cycles * DT).cycles:
            frames = [[(cam, c.time - k * DT) for k in FRAME_OFFSETS] for cam in planner.cfg.cameras]
            res = planner.plan(c.images, c.history, frames=frames)
            rows = res.prompt_len
    finally:
        torch_backend.write_image_blocks = saved
        planner.close()
    return {"planner": "stream" if stream else "full", "prompt_rows": rows,
            "ms_p50": {k: round(float(np.median(v[skip:])), 2) for k, v in calls.items() if v[skip:]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.stream_breakdown", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="checkpoints/tiny")
    p.add_argument("--drive-seed", type=count(0), default=11)
    p.add_argument("--cycles", type=count(6), default=20)
    p.add_argument("--skip", type=count(0), default=5)
    p.add_argument("--threads", type=count(1), default=1)
    args = p.parse_args(argv)
    if args.skip >= args.cycles:
        p.error(f"--skip {args.skip} leaves no cycle of --cycles {args.cycles}")
    import torch

    torch.set_num_threads(args.threads)
    for stream in (False, True):
        print(json.dumps(breakdown(args.checkpoint, args.drive_seed, args.cycles, args.skip, stream)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
