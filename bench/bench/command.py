"""`specdrive bench`: speculative vs plain decoding in one process, on the same scenes. (the library of tools/bench.py)

Modes: plain target decoding, then every draft with each fixed k and adaptive k (greedy). Per
mode: tau, reasoning tokens/s, decode-phase speedup over plain (median and min-max over the
repeats; vision and prefill reported separately), the scenes whose reasoning equals plain
decoding's, cycle latency p50/p99/max, deadline misses, the measured draft cost ratio c and
verify-width costs, the ideal speedup tau / (k c + v(k+1)) and the efficiency against it; and
where the draft is accepted (routine vs commitment words, scenario families). Writes OUT (JSON),
a speedup plot and a picture of one scene's reasoning colored by who produced each word.
Drafts of a checkpoint folder are found by their meta.json (kind "draft"), never by folder name.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common.compared_backends import open_bench_backends
from bench.common.sources import announce_fingerprints, check_scene_cameras, default_tokenizer, source_stamp
from bench.common.threads import torch_threads
from bench.bench import report
from bench.bench.measure import BenchConfig, BenchScene, machine_info, make_modes, run_bench
from core.config import ConfigError
from runtime.artifacts import ModelSource
from runtime.config import load_planner_config


@dataclass(frozen=True)
class BenchRun:
    """One `specdrive bench` run: what runs (source, drafts, profile), what is measured (measure;
    deadline_ms None: the profile's budget_ms) and where the outputs go."""
    source: ModelSource
    measure: BenchConfig
    json: Path
    drafts: str | None = None       # comma list of draft variants (compared_backends.py)
    profile: str = "cpu"
    deadline_ms: float | None = None
    threads: int = 1                # torch CPU threads (0 = torch's default)
    plot: Path | None = None        # default: json with .png
    accept_plot: Path | None = None     # default: json's stem + _accept.png
    command: str = "specdrive bench"    # how to rerun it (the record's setup)


def bench_scenes(cfg: BenchConfig) -> list[BenchScene]:
    """`scenes` synthetic scenes from `seed` (the split picks only the families and the ranges: the
    same seed gives the same scene in train, val and test), or, with `data`, the first `scenes`
    scenes of that dataset split (scenes generate: a split's scenes have seeds of their own)."""
    from scenes.world import make_scene

    if cfg.data is not None:
        from scenes.dataset import load

        split = load(str(cfg.data), cfg.split)
        if len(split) < cfg.scenes:
            raise ConfigError(f"--scenes {cfg.scenes}: {str(cfg.data)!r} split {cfg.split!r} holds "
                              f"{len(split)} scenes; allowed 1..{len(split)}")
        named = [(f"{cfg.split}/{i}", split[i]) for i in range(cfg.scenes)]
    else:
        named = [(f"seed{cfg.seed + i}", make_scene(cfg.seed + i, split=cfg.split)) for i in range(cfg.scenes)]
    out = []
    for name, s in named:
        if s.images is None:
            raise ConfigError(f"scene {name} has no camera images (a dataset made with --no-render?); "
                              "the bench needs them")
        out.append(BenchScene(name, s.family, np.asarray(s.images),
                              np.asarray(s.history, np.float32), int(sum(s.coc_routine)),
                              np.asarray(s.future, np.float32)))
    return out


def run(cfg: BenchRun) -> int:
    profile = load_planner_config(cfg.profile)
    deadline = profile.budget.budget_ms if cfg.deadline_ms is None else cfg.deadline_ms
    measure = dataclasses.replace(cfg.measure, deadline_ms=deadline)
    src = cfg.source
    check_scene_cameras(profile)
    fingerprints = announce_fingerprints(src, profile.fingerprint)
    stamp = source_stamp(src, fingerprints, cfg.command)
    tok, plain, drafts, source = open_bench_backends(src, cfg.drafts, profile.max_len, default_tokenizer)
    modes = make_modes(drafts, plain, measure)
    with torch_threads(cfg.threads):
        try:
            record = run_bench(modes, bench_scenes(measure), tok, profile, measure, progress=True)
            record["machine"] = machine_info(src.device)
        finally:
            for be in {id(m.backend): m.backend for m in modes}.values():
                be.close()
    record["setup"] = {"source": source, "fingerprints": fingerprints, "backend": plain.name, "device": src.device,
                       "kv_buckets": getattr(plain, "kv_buckets", None),     # torch: attention over a kv bucket
                       "profile": str(cfg.profile), "command": cfg.command,
                       **{k: str(v) if isinstance(v, Path) else v for k, v in vars(measure).items()},
                       "threads": cfg.threads,
                       "fallback": profile.fallback, "decoding": "greedy",
                       "gc": "collected before, disabled inside every timed cycle"}
    record["stamp"] = stamp
    write_outputs(cfg, record)
    return 0


def write_outputs(cfg: BenchRun, record: dict) -> None:
    cfg.json.parent.mkdir(parents=True, exist_ok=True)
    plot = cfg.plot or cfg.json.with_suffix(".png")
    accept = cfg.accept_plot or cfg.json.with_name(cfg.json.stem + "_accept.png")
    best = report.best_mode(record) or record["modes"][-1]["name"]
    record["best"] = best
    record["criterion"] = report.criterion(record)
    record["pictures"] = {"speedup": str(plot), "where_accepted": str(accept),
                          "where_accepted_mode": best}
    try:
        report.plot_bench(plot, record)
        record["pictures"]["where_accepted_scene"] = report.plot_where(accept, record, best,
                                                                             cfg.measure.picture_scene)
    except ModuleNotFoundError as e:     # a vehicle-side install has no plotting library
        if e.name != "matplotlib":
            raise
        record["pictures"] = None
        print("pictures skipped: matplotlib is not installed (pip install '.[plots]')", flush=True)
    cfg.json.write_text(json.dumps(record, indent=1) + "\n")
    cfg.json.with_suffix(".md").write_text(report.markdown_report(record))
    print(report.table(record), flush=True)
    for line in report.aa_lines(record):
        print(line, flush=True)
    print(f"issue 6 bar (>= 2.5x, same output, >= 85% of ideal): {record['criterion']}", flush=True)
    pictures = f", {plot}, {accept}" if record["pictures"] else ""
    print(f"best: {best}; wrote {cfg.json} (and .md){pictures}", flush=True)
