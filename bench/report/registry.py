"""The registry of published results: every measurement table in README.md and docs/*.md.

Two tables:
- RUNS: NAME -> the commands that make a results JSON and the JSON files they write (each JSON
  carries a `stamp`, core/stamp.py: checkpoint fingerprint, command, date, commit), and kept in
  git as results/NAME.json: the fields its tables read, with the stamp (bench/report/summary.py).
- TABLES: NAME -> the runs it reads, the renderer (records -> markdown) and the markdown files
  holding `<!-- results NAME fingerprint=... -->` ... `<!-- /results NAME -->`.

`specdrive report` (tools/report.py, bench/report/command.py) cuts results/NAME.json from a run's
own JSON when it is there, and renders every table from results/; with --run-stale it first
re-runs each run that has neither, or is stamped with another checkpoint than checkpoints/tiny.
tests/test_results_summaries.py renders every table from results/ and fails when the markdown
differs. A run whose results/NAME.json is not kept says why in `unkept`; its tables are then
rendered only where its own JSON is (and are not checked from git).
Renderers reuse the markdown of each command's own library; nothing is formatted twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ENGINES = "build/engines/tiny-ort"
EXPORT = f"specdrive export onnx --checkpoint checkpoints/tiny --out {ENGINES}"


@dataclass(frozen=True)
class Run:
    """Commands run in order (a `specdrive ...` or `make ...` line each); the last writes `outputs`.
    unkept: why results/NAME.json is not in git (empty: it is, and the tests check its tables).
    compact: results/NAME.json on one line (a summary of per-scene records, megabytes indented)."""
    commands: tuple[str, ...]
    outputs: tuple[str, ...]
    unkept: str = ""
    compact: bool = False


@dataclass(frozen=True)
class Table:
    runs: tuple[str, ...]                       # the RUNS it reads, in the renderer's order
    files: tuple[str, ...]                      # markdown files with its markers
    render: Callable[[list[dict]], str]         # the records (one per output, runs in order) -> markdown


ROOFLINE = [(p, d, x) for p in ("alpamayo-r1-10b", "edge-2b") for d, x in (("orin-agx-64", "int8"), ("thor", "fp8"))]

# The ~4x claim projected with the flat drafts' tau interval (docs/claims.md): the interval's ends
# (test split, `make claims`, 5 seeds x 200 shared scenes, k = 8, the shared-scene bootstrap of
# train.claims), each priced by the roofline for edge-2b and alpamayo-r1-10b on Orin INT8, with the
# full draft head and 8,192 rows.
PROJECTION_TAU = (5.23, 5.81)
PROJECTION = [(p, head, tau) for p in ("edge-2b", "alpamayo-r1-10b") for head in (0, 8192) for tau in PROJECTION_TAU]

RUNS = {
    "bench": Run(("specdrive bench --checkpoint checkpoints/tiny --scenes 16 --seed 0 --ks 4,8,16 "
                  "--json out/bench/bench.json",), ("out/bench/bench.json",)),
    "drives": Run(("specdrive bench --checkpoint checkpoints/tiny --drives data/drives --drive-count 4 --modes "
                   "plain+vision,spec,spec+vision,spec+vision+lookup,spec+vision+stream,spec+vision+lookup+stream "
                   "--drafts flat --threads 1 --json out/bench/drives.json",), ("out/bench/drives.json",)),
    "drives20": Run(("specdrive bench --checkpoint checkpoints/tiny --drives data/drives --drive-count 20 --modes spec "
                     "--drafts flat --no-adaptive --ks 8 --json out/bench/drives20-k8-flat.json",),
                    ("out/bench/drives20-k8-flat.json",)),
    "closed-loop": Run(("specdrive drive --checkpoint checkpoints/tiny --drives data/drives --latency "
                        "orin-agx-64:edge-2b --budget-ms 700 --out out/drive20 --gifs 0 --quiet",),
                       ("out/drive20/orin-agx-64_edge-2b/drives.json",)),
    "roofline": Run(tuple(f"specdrive roofline --preset {p} --device {d} --precision {x} --memory "
                          f"--json out/roofline/{p}_{d}.json" for p, d, x in ROOFLINE),
                    tuple(f"out/roofline/{p}_{d}.json" for p, d, _ in ROOFLINE)),
    "bench-ort": Run((EXPORT, f"specdrive bench --engines {ENGINES} --backend onnxruntime --scenes 16 --seed 0 "
                              "--json out/bench-ort/bench.json"), ("out/bench-ort/bench.json",)),
    "precision": Run((EXPORT, f"specdrive calibrate record --engines {ENGINES}",
                      f"specdrive calibrate report --engines {ENGINES} --out out/calibration-report"),
                     ("out/calibration-report/report.json",)),
    "profile": Run(("specdrive profile --checkpoint checkpoints/tiny --cycles 16 --out out/profile",
                    "specdrive roofline --preset tiny --device cpu --memory --validate out/profile/stats.json "
                    "--json out/profile/roofline_cpu.json"),      # = make profile
                   ("out/profile/stats.json", "out/profile/roofline_cpu.json")),
    # its per-scene records (every seed of every draft, three splits) on one line: about 3 MB
    "claims": Run(("make claims",), ("runs/claims-eval/metrics.json",), compact=True),
    "projection": Run(tuple(f"specdrive roofline --preset {p} --device orin-agx-64 --precision int8 --k 8 --tau {t}"
                            f"{f' --draft-vocab {h}' if h else ''} --json out/roofline/claims_{p}_{h}_{t}.json"
                            for p, h, t in PROJECTION),
                      tuple(f"out/roofline/claims_{p}_{h}_{t}.json" for p, h, t in PROJECTION)),
    "trees": Run(("specdrive bench --checkpoint checkpoints/tiny --drafts flat --ks 4,6,8 --trees \"16,8,4;32,8,8\" "
                  "--scenes 16 --seed 0 --repeats 3 --threads 1 --json out/bench/trees.json",),
                 ("out/bench/trees.json",)),
    # the AARL grid (configs/grids/aarl-power.yaml): its cells are trained by `specdrive train grid
    # --config configs/grids/aarl-power.yaml [--max-cells N]` and committed under results/grids/
    # as each finishes; --status gathers the finished ones (seconds, no training)
    "aarl-power": Run(("specdrive train grid --config configs/grids/aarl-power.yaml --status",),
                      ("runs/grid/aarl-power/summary.json",)),
    # the FlatRoPE dose-response grid (configs/grids/flatrope-dose.yaml), the same way
    "flatrope-dose": Run(("specdrive train grid --config configs/grids/flatrope-dose.yaml --status",),
                         ("runs/grid/flatrope-dose/summary.json",)),
    # issue 36's adaptive goal, measured once on test scenes no change was tuned on (seeds 100-147),
    # with an A/A control (the k = 8 chain twice): the run's own noise beside the difference
    "adaptive": Run(("specdrive bench --checkpoint checkpoints/tiny --drafts flat --ks 6,8 --aa --scenes 48 "
                     "--seed 100 --repeats 3 --threads 1 --json out/bench/adaptive.json",),
                    ("out/bench/adaptive.json",)),
}


# --- renderers: each reuses its command's own markdown ------------------------------------------

def headline(records: list[dict]) -> str:
    """README: plain against the best mode of `specdrive bench` (decode and cycle speedup, same
    reasoning) and against the fastest exact mode on whole drives."""
    bench, drives = records
    modes = {m["name"]: m for m in bench["modes"]}
    plain, best = modes["plain"], modes[bench["best"]]
    exact = [m for m in drives["modes"] if m["name"] != "plain" and not m.get("failed")
             and m["identical"]["equal"] == m["identical"]["cycles"] and m["cycle_speedup_p50"] is not None]
    fast = max(exact, key=lambda m: m["cycle_speedup_p50"]) if exact else None
    dplain = next(m for m in drives["modes"] if m["name"] == "plain")
    rows = ["| | decode-phase speedup | cycle p50 | cycle speedup | whole drives: cycle p50, speedup "
            "| same reasoning as plain |", "|---|---|---|---|---|---|",
            f"| plain target | 1.00x | {plain['cycle_ms']['p50']:.0f} ms | 1.00x "
            f"| {dplain['cycle_ms']['p50']:.0f} ms, 1.00x | - |"]
    drive = (f"{fast['name']}: {fast['cycle_ms']['p50']:.0f} ms, **{fast['cycle_speedup_p50']:.2f}x**"
             if fast else "no exact mode")
    same = (f"{best['identical']['equal']}/{best['identical']['scenes']} scenes"
            + (f", {fast['identical']['equal']}/{fast['identical']['cycles']} drive cycles" if fast else ""))
    sp, cs = best["decode_speedup"], best["cycle_speedup"]
    rows.append(f"| {best['name']} (best) | **{sp['all']:.2f}x** ({sp['min']:.2f}-{sp['max']:.2f}) "
                f"| {best['cycle_ms']['p50']:.0f} ms | **{cs['p50']:.2f}x** ({cs['min']:.2f}-{cs['max']:.2f}) "
                f"| {drive} | {same} |")
    return "\n".join(rows)


def bench_report(records: list[dict]) -> str:
    from bench.bench.report import markdown_report
    return markdown_report(records[0])


def comparison(modes: tuple[str, ...]) -> Callable[[list[dict]], str]:
    def render(records: list[dict]) -> str:
        from bench.bench.report import comparison_table
        return comparison_table(records[0], list(modes))
    return render


def bench_table(records: list[dict]) -> str:
    from bench.bench.report import markdown_table
    return markdown_table(records[0])


def bench_acceptance(records: list[dict]) -> str:
    """The modes, their acceptance per token class and the A/A control's line (docs/bench.md's
    trees and adaptive runs: the report's other parts are the main bench's)."""
    from bench.bench.report import aa_lines, acceptance_table, markdown_table
    r = records[0]
    return "\n".join([markdown_table(r), "", *acceptance_table(r), *[f"- {line}" for line in aa_lines(r)]]).rstrip("\n")


def drives_table(records: list[dict]) -> str:
    from bench.bench.drives.measure import markdown_table
    return markdown_table(records[0])


def drives20(records: list[dict]) -> str:
    from bench.bench.drives.measure import phase_table
    return phase_table(records[0], "spec")


def closed_loop(records: list[dict]) -> str:
    from bench.drive.report import table
    r = records[0]
    return table(r["records"], list(r["modes"]), r["latency"], r["budget_ms"])


def roofline_snapshot(records: list[dict]) -> str:
    from bench.roofline.report import snapshot_table
    return snapshot_table(records)


def roofline_drive(records: list[dict]) -> str:
    from bench.roofline.report import drive_table
    return drive_table(records)


def precision(records: list[dict]) -> str:
    from calibration.report import variants_table
    return variants_table(records[0])


def profile(records: list[dict]) -> str:
    from bench.profile.report import format_table
    s = records[0]
    return (format_table(s["stages"]) + f"\n\n{s['cycles']} cycles; prompt {s['prompt_len']} tokens, "
            f"{s['reasoning_tokens']:.1f} reasoning tokens per cycle; peak host memory "
            f"{s['peak_host_memory_mib']:.0f} MiB; {s['threads']} thread(s).")


def roofline_validation(records: list[dict]) -> str:
    from bench.roofline.command import format_validation
    r = records[1]
    peaks = r.get("peaks") or {}
    return (format_validation(r["validation"]) + "\n\nThis CPU's peaks, measured in the same run "
            f"(bench/roofline/microbench.py): {', '.join(f'{k} {v}' for k, v in peaks.items())}.")


def claims(part: str) -> Callable[[list[dict]], str]:
    def render(records: list[dict]) -> str:
        from train import claims_report
        return "\n".join(getattr(claims_report, part)(records[0]["splits"]))
    render.__name__ = f"claims_{part}"
    return render


def aarl_grid(records: list[dict]) -> str:
    from train import claims_report
    return "\n".join(claims_report.aarl_grid_table(records[0]))


def dose_grid(records: list[dict]) -> str:
    from train import claims_report
    return "\n".join(claims_report.dose_grid_table(records[0]))


def projection(records: list[dict]) -> str:
    """A row per preset and draft head: the reasoning stage, plain against speculative at the tau
    interval's two ends, and the speedup range."""
    rows = ["| preset (Orin, int8) | draft head | tau (k = 8) | reasoning plain | reasoning speculative | "
            "reasoning speedup |", "|---|---|---|---|---|---|"]
    for i in range(0, len(records), 2):
        lo, hi = records[i], records[i + 1]
        preset, head, _ = PROJECTION[i]
        pl = lo["plain"]["reasoning_ms"]
        a, b = lo["speculative"]["reasoning_ms"], hi["speculative"]["reasoning_ms"]
        rows.append(f"| {preset} | {'full' if not head else f'{head:,} rows'} | {lo['workload']['tau']:.2f} to "
                    f"{hi['workload']['tau']:.2f} | {pl:.1f} ms | {a:.1f} to {b:.1f} ms | "
                    f"{pl / a:.2f}x to {pl / b:.2f}x |")
    return "\n".join(rows)


TABLES = {
    "headline": Table(("bench", "drives"), ("README.md",), headline),
    "bench": Table(("bench",), ("docs/bench.md",), bench_report),
    "draft-head-bench": Table(("bench",), ("docs/bench.md",),
                              comparison(("flat k=4", "flat-v256 k=4", "flat k=8", "flat-v256 k=8"))),
    "eagle3": Table(("bench",), ("docs/bench.md",), comparison(("flat k=4", "flat-v256 k=4", "eagle3-v256 k=4",
                                                                 "flat k=8", "flat-v256 k=8", "eagle3-v256 k=8"))),
    "drives": Table(("drives",), ("docs/bench.md",), drives_table),
    "drives20-k8": Table(("drives20",), ("docs/bench.md",), drives20),
    "closed-loop": Table(("closed-loop",), ("docs/drive.md",), closed_loop),
    "roofline-snapshot": Table(("roofline",), ("docs/profile.md",), roofline_snapshot),
    "roofline-drive": Table(("roofline",), ("docs/profile.md",), roofline_drive),
    "profile": Table(("profile",), ("docs/profile.md",), profile),
    "roofline-validation": Table(("profile",), ("docs/profile.md",), roofline_validation),
    "bench-ort": Table(("bench-ort",), ("docs/engines.md",), bench_table),
    "precision": Table(("precision",), ("docs/engines.md",), precision),
    **{f"claims-{name}": Table(("claims",), ("docs/claims-data.md",), claims(f"{part}_table"))
       for name, part in (("acceptance", "acceptance"), ("comparison", "comparison"), ("attention", "attention"),
                          ("budget", "budget"), ("aarl", "aarl"))},
    "claims-verdicts": Table(("claims",), ("docs/claims.md", "docs/claims-data.md"), claims("verdict_table")),
    "claims-attention-summary": Table(("claims",), ("docs/claims.md",), claims("attention_table")),
    "claims-aarl-seeds": Table(("claims",), ("docs/claims.md",), claims("aarl_table")),
    "claims-4x-measured": Table(("bench",), ("docs/claims.md",),
                                comparison(("flat k=8", "mrope k=8", "flat-standalone k=8", "flat-aarl k=8"))),
    "trees": Table(("trees",), ("docs/bench.md",), bench_acceptance),
    "adaptive": Table(("adaptive",), ("docs/bench.md",), bench_acceptance),
    "claims-4x-projected": Table(("projection",), ("docs/claims.md",), projection),
    "claims-aarl-power": Table(("aarl-power",), ("docs/claims.md",), aarl_grid),
    "claims-flatrope-dose": Table(("flatrope-dose",), ("docs/claims.md",), dose_grid),
}
