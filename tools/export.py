"""`specdrive export onnx`: a checkpoint folder -> ONNX graphs + meta.json (export/onnx.py).
`specdrive export edgellm`: a checkpoint folder -> TensorRT Edge-LLM's input folders (export/edgellm.py).

    specdrive export onnx --checkpoint DIR --out DIR [--draft NAME] [--profile cpu] [--reuse DIR]
                          [--max-len N] [--k-max K]
    specdrive export edgellm [--checkpoint checkpoints/tiny-causal] --out DIR [--draft NAME] [--dtype float16]

The prompt contract's shapes (cameras, frames, image size), the expert's draws and how they
combine, and max_len come from the planner profile unless given here.
"""
from __future__ import annotations

from pathlib import Path

from core.config import ConfigError
from runtime.config import load_planner_config
from tools.argtypes import integer

# the causal twin of checkpoints/tiny: what runtimes that build their own causal mask take (Edge-LLM,
# TensorRT-LLM, transformers), the default of every interop path
CAUSAL = Path("checkpoints/tiny-causal")


def check_checkpoint(folder: Path) -> None:
    """A trained planner folder, or a ConfigError naming what is missing and where to get one."""
    if folder == CAUSAL and not folder.is_dir():
        raise ConfigError(f"--checkpoint defaults to {CAUSAL} (the causal twin of checkpoints/tiny), which is not "
                          "in this tree; check it out, or train it with `make train-causal`")
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"--checkpoint {str(folder)!r} is not a trained planner folder (no tokenizer.json)")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="export a checkpoint folder (onnx, edgellm)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="format", metavar="FORMAT")
    sub.required = True
    o = sub.add_parser("onnx", help="ONNX graphs for the onnxruntime backend")
    o.add_argument("--checkpoint", type=Path, required=True, help="trained planner folder")
    o.add_argument("--out", type=Path, required=True, help="engines folder to write")
    o.add_argument("--draft", default=None, help="draft variant (default: flat, else the only one)")
    o.add_argument("--profile", default="cpu", help="planner profile: prompt shapes, draws, max_len")
    o.add_argument("--max-len", type=integer, default=None, help="cache rows (default: the profile's)")
    o.add_argument("--k-max", type=integer, default=None, help="largest draft length (default: the profile's)")
    o.add_argument("--reuse", type=Path, default=None, metavar="DIR",
                   help="an earlier export of the same target and expert (same profile): copy its target and "
                        "expert graphs and export only the draft's (seconds instead of minutes)")
    o.add_argument("--draft-map", default="graph", choices=("graph", "host"),
                   help="a reduced draft head: its d2t map inside the draft graphs (default) or on the host")
    o.set_defaults(run=run)
    e = sub.add_parser("edgellm", help="the target, the EAGLE-3 draft and the action expert for TensorRT Edge-LLM")
    e.add_argument("--checkpoint", type=Path, default=CAUSAL,
                   help=f"trained planner folder with a causal target (default: {CAUSAL}, the shipped causal twin)")
    e.add_argument("--out", type=Path, required=True, help="folder to write (target/, draft/, action/, README.md)")
    e.add_argument("--draft", default=None, help="the EAGLE-3 draft variant (default: the folder's only one)")
    e.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"),
                   help="weights' dtype (default float16: what Edge-LLM's visual and action layers take)")
    e.set_defaults(run=run_edgellm)


def run_edgellm(args) -> int:
    from export.edgellm import export_edgellm

    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {str(args.out)!r} is a file; give a folder")
    check_checkpoint(args.checkpoint)
    done = export_edgellm(args.checkpoint, args.out, args.draft, args.dtype)
    print(f"wrote {done.out}: target/, draft/ ({done.draft}), action/, README.md; feature layers "
          f"{list(done.feature_layers)} = Edge-LLM hidden_states {list(done.hf_layers)}")
    return 0


def run(args) -> int:
    from export.onnx import ExportConfig, export_onnx

    prof = load_planner_config(args.profile)
    cfg = ExportConfig(max_len=args.max_len or prof.max_len, k_max=args.k_max or prof.spec.k_max,
                       samples=prof.trajectory_samples, combine=prof.trajectory_combine,
                       cameras=len(prof.cameras), frames=prof.frames, image_hw=tuple(prof.image_hw),
                       draft_map=args.draft_map)
    if cfg.max_len < 64 or cfg.k_max < 1:
        raise ConfigError(f"--max-len {cfg.max_len} / --k-max {cfg.k_max}: need max_len >= 64, k_max >= 1")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {str(args.out)!r} is a file; give a folder")
    meta = export_onnx(args.checkpoint, args.out, args.draft, cfg, reuse=args.reuse)
    print(f"wrote {len(meta.graphs)} graphs, meta.json and tokenizer.json to {args.out}; run them with "
          f"`specdrive plan --engines {args.out}`")
    return 0
