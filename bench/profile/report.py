"""What `specdrive profile` makes of recorded ranges (runtime/trace.py): a Chrome trace, the
per-stage table and the per-call costs the roofline validation compares against.

A stage's share is its total time over the total time of the cycles (ranges nest: "reasoning"
holds the "draft", "verify" and "accept" ranges of its steps, so shares of nested names overlap).
"""
from __future__ import annotations

import os

import numpy as np

ORDER = ("cycle", "fallback_wait", "vision", "prefill", "fallback", "reasoning", "draft", "verify",
         "accept", "expert_wait", "trajectory", "action", "checks")


def chrome_trace(ranges, threads: dict) -> dict:
    """Trace Event Format ("X" complete events, microseconds): chrome://tracing or ui.perfetto.dev."""
    t0 = min((r.start_ns for r in ranges), default=0)
    pid = os.getpid()
    events = [{"name": r.name, "cat": "specdrive", "ph": "X", "pid": pid, "tid": r.thread,
               "ts": (r.start_ns - t0) / 1e3, "dur": (r.end_ns - r.start_ns) / 1e3} for r in ranges]
    events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": t, "args": {"name": n}}
               for t, n in threads.items()]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def stage_table(ranges) -> list[dict]:
    """Per range name: count, mean, p50, p99, max (ms) and share of the cycles' total time."""
    by: dict[str, list] = {}
    for r in ranges:
        by.setdefault(r.name, []).append(r.ms)
    cycle_total = sum(by.get("cycle", [])) or None
    names = [n for n in ORDER if n in by] + sorted(n for n in by if n not in ORDER)
    rows = []
    for name in names:
        xs = np.asarray(by[name])
        rows.append({"stage": name, "count": int(xs.size), "mean_ms": float(xs.mean()),
                     "p50_ms": float(np.percentile(xs, 50)), "p99_ms": float(np.percentile(xs, 99)),
                     "max_ms": float(xs.max()),
                     "share": float(xs.sum() / cycle_total) if cycle_total else None})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["| range | count | mean ms | p50 ms | p99 ms | max ms | share of cycle |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = "-" if r["share"] is None else f"{100 * r['share']:.1f}%"
        lines.append(f"| {r['stage']} | {r['count']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} | {share} |")
    return "\n".join(lines)


def call_costs(ranges, cycles: list[dict]) -> dict:
    """Mean ms per engine call for the roofline validation: vision, prefill, one draft step
    (a draft call of k proposals / k), verify per width, action. Verify and draft ranges are
    matched to each cycle's decode steps (decode.ks, in order) within the cycle's range."""
    main = [r for r in ranges if r.name == "cycle"]
    out = {"vision": [], "prefill": [], "action": [], "draft_step": [], "verify": {}}
    for cyc, rec in zip(sorted(main, key=lambda r: r.start_ns), cycles):
        inside = sorted((r for r in ranges if r.thread == cyc.thread and cyc.start_ns <= r.start_ns
                         and r.end_ns <= cyc.end_ns), key=lambda r: r.start_ns)
        for name in ("vision", "prefill", "action"):
            out[name] += [r.ms for r in inside if r.name == name]
        ks = (rec.get("decode") or {}).get("ks", [])
        verifies = [r for r in inside if r.name == "verify"]
        drafts = iter(r for r in inside if r.name == "draft")
        pending = 1
        for k, v in zip(ks, verifies):
            out["verify"].setdefault(pending + k, []).append(v.ms)
            if k:
                out["draft_step"].append(next(drafts).ms / k)
    mean = lambda xs: float(np.mean(xs)) if xs else None   # noqa: E731
    return {"vision": mean(out["vision"]), "prefill": mean(out["prefill"]), "action": mean(out["action"]),
            "draft_step": mean(out["draft_step"]),
            "verify": {str(w): mean(v) for w, v in sorted(out["verify"].items())}}
