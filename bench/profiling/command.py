"""`specdrive profile`: N planner cycles with named ranges on every stage and engine call. (the library of tools/profile.py)

With `nsys` on PATH and a GPU, the cycles run under `nsys profile -t cuda,nvtx,osrt` with the
capture range "measure@specdrive" (the warm-up is not captured) and the report is
OUT/profile_<profile>_<backend>_<model>.nsys-rep. Otherwise (or with --no-nsys) the ranges are
recorded here: OUT/trace.json (Chrome trace: ui.perfetto.dev or chrome://tracing), OUT/stats.json
and stats.md (per-stage table, per-call costs, peak host memory), OUT/cycles.jsonl and the
pictures of tools/timeline.py.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from prompt.config import ConfigError
from runtime import trace
from runtime.artifacts import open_backend
from runtime.config import load_planner_config
from runtime.planner import Planner
from bench.profiling import report as profile_report, timeline
from bench.common.cycle_report import JsonLog
from bench.common.sources import default_tokenizer, model_source, scene_source
from bench.common.threads import torch_threads


def report_name(args) -> str:
    """profile_<planner profile>_<backend>_<model label> (a label only: nothing is read from it)."""
    model = args.engines or args.checkpoint
    label = Path(model).resolve().name if model is not None else f"{args.preset}-seed{args.random_init}"
    backend = args.backend or ("engines" if args.engines else "torch")
    return f"profile_{Path(args.profile).stem}_{backend}_{label}"


def gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def nsys_command(args, argv: list[str]) -> list[str]:
    """nsys around this same command (with --no-nsys --nvtx), capturing from "measure" on."""
    out = args.out / report_name(args)
    return ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=nvtx",
            f"--nvtx-capture={trace.CAPTURE}@{trace.DOMAIN}", "--capture-range-end=stop",
            "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0,SPECDRIVE_NVTX=1", "--force-overwrite=true",
            "-o", str(out), sys.executable, "-m", "tools.cli", "profile", *argv, "--no-nsys", "--nvtx"]


def run(args) -> int:
    if args.cycles < 1 or args.warmup < 0:
        raise ConfigError(f"--cycles={args.cycles} must be >= 1 and --warmup={args.warmup} >= 0")
    if args.preset and args.random_init is None:
        raise ConfigError("--preset needs --random-init SEED (random weights)")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_nsys and shutil.which("nsys") and gpu_present():
        argv = sys.argv[sys.argv.index("profile") + 1:] if "profile" in sys.argv else []
        cmd = nsys_command(args, argv)
        print(" ".join(cmd), flush=True)
        rc = subprocess.run(cmd).returncode
        rep = args.out / f"{report_name(args)}.nsys-rep"
        print(f"report: {rep}\nopen it in the Nsight Systems GUI (nsys-ui {rep}) or summarize the ranges: "
              f"nsys stats --report nvtx_sum {rep}", flush=True)
        return rc
    stats = profile_here(args)
    print(profile_report.format_table(stats["stages"]), flush=True)
    print(f"wrote {args.out}/trace.json (open in ui.perfetto.dev or chrome://tracing), stats.json, "
          f"stats.md, cycles.jsonl, timeline.png, stages.png, accepted.png", flush=True)
    return 0


def profile_here(args) -> dict:
    """Warm-up, then args.cycles recorded cycles; writes the outputs and returns the stats."""
    cfg = load_planner_config(args.profile)
    src = model_source(args)
    backend, tok = open_backend(src, cfg.max_len, default_tokenizer, k_max=cfg.spec.k_max)
    planner = Planner(backend, tok, cfg)
    args.scenes, args.data, args.split = args.cycles, None, "test"
    rec, cycles = trace.Recorder(), []
    log = JsonLog(args.out / "cycles.jsonl")
    try:
        with torch_threads(args.threads):
            scenes = list(scene_source(args, tok))
            if args.warmup:
                planner.warmup(scenes[0].images, scenes[0].history, args.warmup)
            if args.nvtx and not trace.nvtx_available():
                print("--nvtx: the nvtx package is not installed (pip install nvtx); ranges are "
                      "recorded here only", flush=True)
            trace.enable(rec, nvtx=args.nvtx and trace.nvtx_available())
            measure = trace.begin(trace.CAPTURE)
            for s in scenes:
                res = planner.plan(s.images, s.history, scene=s.name)
                cycles.append(res.to_json())
                log.write({**cycles[-1], "family": s.family})
            trace.end(measure)
    finally:
        trace.disable()
        log.close()
        planner.close()
    ranges = [r for r in rec.ranges if r.name != trace.CAPTURE]
    stats = summarize(ranges, cycles, args)
    (args.out / "trace.json").write_text(json.dumps(profile_report.chrome_trace(ranges, rec.threads)))
    (args.out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    (args.out / "stats.md").write_text(profile_report.format_table(stats["stages"]) + "\n")
    timeline.draw_all(cycles, args.out)
    return stats


def summarize(ranges, cycles: list[dict], args) -> dict:
    decoded = [c["decode"].get("emitted", 0) for c in cycles if c.get("decode")]
    return {"name": report_name(args), "command": "specdrive profile " + " ".join(sys.argv[2:]),
            "cycles": len(cycles), "stages": profile_report.stage_table(ranges),
            "calls": profile_report.call_costs(ranges, cycles),
            "prompt_len": max((c["prompt_len"] for c in cycles), default=0),
            "reasoning_tokens": sum(decoded) / len(decoded) if decoded else 0.0,
            "peak_host_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": args.threads, "pid": os.getpid()}
