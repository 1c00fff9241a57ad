"""`specdrive calibrate`: the calibration set and the accuracy report of quantized graphs.

    specdrive calibrate record --engines DIR [--prompts 128] [--seed 0] [--profile cpu]
    specdrive calibrate report --engines DIR [--precisions int8,int8_sq,fp8,int4_awq] [--scenes 16]
                               [--seed 0] [--no-blame] [--profile cpu] [--out DIR/report]

DIR is a folder of `specdrive export onnx` (or of `make engines`). `record` runs its fp32 graphs
through the planner on train scenes and keeps each graph's inputs (DIR/calibration/); `report`
quantizes what it needs with ModelOpt (DIR/quant/) and runs every variant through the speculative
loop on held-out scenes (report.md, report.json, report.png). `make engines PROFILE=...` runs both.
"""
from __future__ import annotations

from pathlib import Path

from core.config import ConfigError
from tools.argtypes import integer

PRECISIONS = ("int8", "int8_sq", "fp8", "int4_awq")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="calibration set and accuracy report of quantized graphs",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("record", help="record each graph's inputs on train scenes (DIR/calibration)")
    common(r)
    r.add_argument("--prompts", type=integer, default=128, help="train-split scenes (default 128)")
    r.add_argument("--per-scene", type=integer, default=1, help="calls kept per graph and scene (default 1)")
    r.set_defaults(run=run_record)
    q = sub.add_parser("report", help="quantized variants through the loop against fp32 (held-out scenes)")
    common(q)
    q.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma list of {', '.join(PRECISIONS)}")
    q.add_argument("--scenes", type=integer, default=16, help="held-out scenes (default 16)")
    q.add_argument("--no-blame", action="store_true", help="leave out the one-graph-at-a-time variants")
    q.add_argument("--method", default=None, choices=["max", "entropy"], help="int8 activation ranges "
                   "(default max; fp8 always max, INT4 AWQ its clip search)")
    q.add_argument("--out", type=Path, default=None, help="report folder (default DIR/report)")
    q.set_defaults(run=run_report)


def common(p) -> None:
    p.add_argument("--engines", type=Path, required=True, help="folder of `specdrive export onnx`")
    p.add_argument("--profile", default="cpu", help="planner profile the loop runs with (its max_len "
                   "must be the graphs')")
    p.add_argument("--seed", type=integer, default=0, help="seed of the scene draw")
    p.add_argument("--threads", type=integer, default=1, help="onnxruntime CPU threads (default 1)")


def _open(args):
    from core.artifacts import EnginesMeta, read_meta
    from runtime.artifacts import load_tokenizer
    from runtime.config import load_planner_config

    meta = read_meta(args.engines)
    backend = meta.backend if isinstance(meta, EnginesMeta) else None
    if backend != "onnxruntime":
        raise ConfigError(f"{args.engines}: not a folder of `specdrive export onnx` (meta.json kind "
                          f"{meta.kind!r}, backend {backend!r})")
    cfg = load_planner_config(args.profile)
    if cfg.max_len != meta.max_len:
        raise ConfigError(f"--profile {args.profile}: max_len {cfg.max_len}, but {args.engines} was exported "
                          f"for max_len {meta.max_len}; give the planner profile it was exported for")
    return meta.reference(), load_tokenizer(args.engines), cfg


def run_record(args) -> int:
    from calibration.record import record
    from calibration.scenes import calibration_scenes

    meta, tok, cfg = _open(args)
    calib = record(args.engines, meta, tok, cfg, calibration_scenes(args.prompts, args.seed),
                   per_scene=args.per_scene, threads=args.threads)
    index = calib.save(args.engines / "calibration")
    counts = ", ".join(f"{g} {f['samples']}" for g, f in index["graphs"].items())
    print(f"calibration set {index['sha256'][:12]}: {len(calib.scenes)} train scenes; samples per graph: "
          f"{counts} -> {args.engines / 'calibration'}")
    return 0


def run_report(args) -> int:
    from calibration.record import load
    from calibration.report import accuracy_report, write_report

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise ConfigError(f"--precisions {args.precisions!r}: a comma list of {list(PRECISIONS)}")
    meta, tok, cfg = _open(args)
    if not (args.engines / "calibration").is_dir():
        raise ConfigError(f"{args.engines}/calibration: no calibration set; first run "
                          f"`specdrive calibrate record --engines {args.engines}`")
    calib = load(args.engines / "calibration")
    report = accuracy_report(args.engines, meta, tok, cfg, calib, precisions, scenes=args.scenes, seed=args.seed,
                             blame=not args.no_blame, threads=args.threads,
                             method=lambda p: args.method if p in ("int8", "int8_sq") else None)
    files = write_report(report, args.out or args.engines / "report")
    for line in report["verdicts"]:
        print(line)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
