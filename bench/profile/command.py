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
from dataclasses import dataclass
from pathlib import Path

from core.config import check_range
from runtime import trace
from runtime.artifacts import ModelSource, open_backend
from runtime.config import load_planner_config
from runtime.planner import Planner
from bench.profile import report as profile_report, timeline
from bench.common.accept_map import routine_tokens
from bench.common.cycle_report import JsonLog
from bench.common.sources import SceneSource, announce_fingerprints, default_tokenizer, scene_source, source_stamp
from bench.common.threads import torch_threads


@dataclass(frozen=True)
class ProfileRun:
    """One `specdrive profile` run: the models, the cycles, how the ranges are recorded, the outputs."""
    source: ModelSource
    out: Path
    profile: str = "cpu"
    cycles: int = 16                # measured cycles, one per synthetic scene
    warmup: int = 2                 # cycles before the capture range
    seed: int = 0                   # first synthetic scene
    threads: int = 1
    no_nsys: bool = False           # record the ranges here even where nsys is
    nvtx: bool = False              # also emit NVTX ranges (the child of nsys)
    argv: tuple[str, ...] = ()      # the command's arguments (nsys reruns them)

    def __post_init__(self):
        check_range("--cycles", self.cycles, lo=1)
        check_range("--warmup", self.warmup, lo=0)


def report_name(setup: ProfileRun) -> str:
    """profile_<planner profile>_<backend>_<model label> (a label only: nothing is read from it)."""
    src = setup.source
    model = src.engines or src.checkpoint
    label = Path(model).resolve().name if model is not None else f"{src.preset}-seed{src.random_init}"
    backend = src.backend or ("engines" if src.engines else "torch")
    return f"profile_{Path(setup.profile).stem}_{backend}_{label}"


def gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def nsys_command(setup: ProfileRun) -> list[str]:
    """nsys around this same command (with --no-nsys --nvtx), capturing from "measure" on."""
    out = setup.out / report_name(setup)
    return ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=nvtx",
            f"--nvtx-capture={trace.CAPTURE}@{trace.DOMAIN}", "--capture-range-end=stop",
            "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0,SPECDRIVE_NVTX=1", "--force-overwrite=true",
            "-o", str(out), sys.executable, "-m", "tools.cli", "profile", *setup.argv, "--no-nsys", "--nvtx"]


def run(setup: ProfileRun) -> int:
    setup.out.mkdir(parents=True, exist_ok=True)
    if not setup.no_nsys and shutil.which("nsys") and gpu_present():
        cmd = nsys_command(setup)
        print(" ".join(cmd), flush=True)
        rc = subprocess.run(cmd).returncode
        rep = setup.out / f"{report_name(setup)}.nsys-rep"
        print(f"report: {rep}\nopen it in the Nsight Systems GUI (nsys-ui {rep}) or summarize the ranges: "
              f"nsys stats --report nvtx_sum {rep}", flush=True)
        return rc
    stats = profile_here(setup)
    print(profile_report.format_table(stats["stages"]), flush=True)
    print(f"wrote {setup.out}/trace.json (open in ui.perfetto.dev or chrome://tracing), stats.json, "
          f"stats.md, cycles.jsonl, timeline.png, stages.png, accepted.png", flush=True)
    return 0


def profile_here(setup: ProfileRun) -> dict:
    """Warm-up, then setup.cycles recorded cycles; writes the outputs and returns the stats."""
    cfg = load_planner_config(setup.profile)
    stamp = source_stamp(setup.source, announce_fingerprints(setup.source, cfg.fingerprint),
                         " ".join(["specdrive profile", *setup.argv]))
    backend, tok = open_backend(setup.source, cfg.max_len, default_tokenizer, k_max=cfg.spec.k_max)
    planner = Planner(backend, tok, cfg)
    rec, cycles = trace.Recorder(), []
    log = JsonLog(setup.out / "cycles.jsonl")
    try:
        with torch_threads(setup.threads):
            scenes = list(scene_source(SceneSource(scenes=setup.cycles, seed=setup.seed), tok))
            if setup.warmup:
                planner.warmup(scenes[0].images, scenes[0].history, setup.warmup)
            if setup.nvtx and not trace.nvtx_available():
                print("--nvtx: the nvtx package is not installed (pip install nvtx); ranges are "
                      "recorded here only", flush=True)
            trace.enable(rec, nvtx=setup.nvtx and trace.nvtx_available())
            measure = trace.begin(trace.CAPTURE)
            for s in scenes:
                res = planner.plan(s.images, s.history, scene=s.name)
                cycles.append({**res.to_json(), "family": s.family,
                               "routine_tokens": routine_tokens(tok, res.reasoning)})   # accepted.png's classes
                log.write(cycles[-1])
            trace.end(measure)
            gpu = gpu_timeline(planner, scenes[-1], setup.out) if setup.source.device.startswith("cuda") else None
    finally:
        trace.disable()
        log.close()
        planner.close()
    ranges = [r for r in rec.ranges if r.name != trace.CAPTURE]
    stats = {"stamp": stamp, **summarize(ranges, cycles, setup), "gpu_cycle": gpu}
    (setup.out / "trace.json").write_text(json.dumps(profile_report.chrome_trace(ranges, rec.threads)))
    (setup.out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    (setup.out / "stats.md").write_text(profile_report.format_table(stats["stages"]) + "\n")
    timeline.draw_all(cycles, setup.out)
    return stats


def gpu_timeline(planner, scene, out: Path) -> dict | None:
    """One more cycle under torch's profiler, host calls and CUDA kernels on one time axis (the
    stretches with no kernel are where the GPU waited for the host) -> OUT/gpu_cycle.pt.trace.json
    (ui.perfetto.dev) and its summary: kernels, their busy time, the GPU's busy share of the
    cycle. None where torch has no CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        planner.plan(scene.images, scene.history, scene=scene.name)
        torch.cuda.synchronize()
    path = out / "gpu_cycle.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return {"trace": path.name, **kernel_busy(json.loads(path.read_text()).get("traceEvents", []))}


def kernel_busy(events: list) -> dict:
    """Kernels of a Chrome trace (cat "kernel"): their count, the union of their intervals (ms)
    and its share of the span from the first kernel's start to the last one's end."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                   for e in events if e.get("cat") == "kernel" and "ts" in e)
    if not spans:
        return {"kernels": 0, "busy_ms": 0.0, "busy_share": None}
    busy, end = 0.0, spans[0][0]
    for a, b in spans:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    total = end - spans[0][0]
    return {"kernels": len(spans), "busy_ms": round(busy / 1e3, 3),
            "busy_share": round(busy / total, 4) if total > 0 else None}


def summarize(ranges, cycles: list[dict], setup: ProfileRun) -> dict:
    decoded = [c["decode"].get("emitted", 0) for c in cycles if c.get("decode")]
    return {"name": report_name(setup), "command": " ".join(["specdrive profile", *setup.argv]),
            "cycles": len(cycles), "stages": profile_report.stage_table(ranges),
            "calls": profile_report.call_costs(ranges, cycles),
            "prompt_len": max((c["prompt_len"] for c in cycles), default=0),
            "reasoning_tokens": sum(decoded) / len(decoded) if decoded else 0.0,
            "peak_host_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": setup.threads, "pid": os.getpid()}
