"""`specdrive engines build`: export -> calibrate -> build for one engine profile (engines/build.py).

    specdrive engines build --profile NAME [--checkpoint DIR] [--out engines/build/NAME]

--checkpoint defaults to checkpoints/tiny, or to its causal twin checkpoints/tiny-causal for a profile
that also writes TensorRT-LLM checkpoints (trtllm.enabled: TensorRT-LLM builds its own causal mask).

Profiles: configs/engines/NAME.yaml. Exit status 0: engines built; 2: a refused profile or
argument; 3: every step before the build done, TensorRT missing here (manifest.json says so).
"""
from __future__ import annotations

from pathlib import Path

from tools.argtypes import out_folder


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("engines", help="TensorRT engines for an engine profile",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    b = sub.add_parser("build", help="export -> calibrate -> build (exit 3 where TensorRT is missing)")
    b.add_argument("--profile", required=True, help="engine profile (configs/engines/NAME.yaml)")
    b.add_argument("--checkpoint", type=Path, default=None,
                   help="trained planner folder (default: checkpoints/tiny; checkpoints/tiny-causal for a profile "
                        "with trtllm.enabled)")
    b.add_argument("--out", type=out_folder, default=None, help="output folder (default: engines/build/PROFILE)")
    b.set_defaults(run=run)


def run(args) -> int:
    from engines.build import build
    from engines.profile import load_profile
    from runtime.config import load_planner_config

    from tools.export import CAUSAL, check_checkpoint

    profile = load_profile(args.profile)
    out = args.out or Path("engines/build") / profile.name
    checkpoint = args.checkpoint or (CAUSAL if profile.trtllm.enabled else Path("checkpoints/tiny"))
    check_checkpoint(checkpoint)
    return build(profile, checkpoint, out, load_planner_config(profile.planner))
