"""`specdrive demo` (`make demo`): the planner on the shipped checkpoint, on CPU.

Draws a few scenes (cameras, bird's-eye view, CoC), then runs `specdrive plan` on a few dozen
test scenes with the default CPU budget: the live table on the terminal, and in OUT the cycle log
(cycles.jsonl), a summary (summary.json) and bird's-eye pictures with the predicted and expert
trajectories and the reasoning (cycle_NNNN.svg). Without a shipped checkpoint it says so and
runs random-weight models, whose reasoning is noise: the loop, budget and pictures still work.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tools.argtypes import integer, out_folder

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the planner on the shipped checkpoint (CPU) and draw it",
                              description=__doc__.splitlines()[0])
    p.add_argument("--out", type=out_folder, default=Path("out/demo"))
    p.add_argument("--cycles", type=integer, default=24, help="planning cycles (test scenes)")
    p.add_argument("--seed", type=integer, default=1000, help="seed of the synthetic test scenes")
    p.add_argument("--checkpoint", type=Path, default=SHIPPED)
    p.set_defaults(run=run)


def shipped_ready(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file()


def draw_scenes(out: Path, seed: int, n: int = 3) -> list[Path]:
    from scenes.show import draw
    from scenes.world import make_scene

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        scene = make_scene(seed + i, split="test")
        paths.append(out / f"scene_{seed + i}.png")
        draw(scene, paths[-1])
    return paths


def run(args: argparse.Namespace) -> int:
    from bench.common.sources import SceneSource
    from bench.plan.command import PlanRun
    from bench.plan.command import run as plan
    from runtime.artifacts import ModelSource
    from tools.cli import UsageError

    if args.cycles < 1:
        raise UsageError(f"--cycles={args.cycles} must be >= 1")
    if args.seed < 0:
        raise UsageError(f"--seed={args.seed} must be >= 0 (scene seeds are non-negative)")
    pictures = draw_scenes(args.out / "scenes", args.seed)
    print(f"scene pictures: {', '.join(str(p) for p in pictures)}", flush=True)
    if shipped_ready(args.checkpoint):
        source = ModelSource(checkpoint=args.checkpoint, threads=1)
    else:
        print(f"NOTE: no trained checkpoint in {args.checkpoint} (no tokenizer.json); running "
              "random-weight models of the tiny preset: the reasoning text is noise.", flush=True)
        source = ModelSource(preset="tiny", random_init=0, threads=1)
    code = plan(PlanRun(source=source, scenes=SceneSource(scenes=args.cycles, seed=args.seed, split="test"),
                        out=args.out))
    print(f"log: {args.out / 'cycles.jsonl'}  summary: {args.out / 'summary.json'}  "
          f"pictures: {args.out}/cycle_*.svg", flush=True)
    return code
