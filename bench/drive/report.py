"""The closed-loop tables of `specdrive drive`: one row per mode, then one row per drive."""
from __future__ import annotations

import numpy as np


def _events(m: dict) -> str:
    """A drive's incidents in a few letters: C collision (at fault), O off-road, R red light, S stop sign."""
    out = [f"C{m['at_fault_collisions']}" if m["at_fault_collisions"] else "",
           f"O{m['off_road_steps']}" if m["off_road_steps"] else "",
           f"R{m['red_light']}" if m["red_light"] else "", f"S{m['stop_sign']}" if m["stop_sign"] else ""]
    return " ".join(x for x in out if x) or "ok"


def mode_row(mode: str, recs: list[dict]) -> str:
    m = [r["metrics"] for r in recs]
    lat = np.concatenate([[c["latency_ms"] for c in r["cycle_log"]] for r in recs])
    ratios = [x["progress_ratio"] for x in m if x["progress_ratio"] is not None]
    ttc = [x["min_ttc_s"] for x in m if x["min_ttc_s"] is not None]
    cells = [mode, len(recs), sum(x["at_fault_collisions"] for x in m),
             sum(x["off_road_steps"] > 0 for x in m), sum(x["red_light"] for x in m), sum(x["stop_sign"] for x in m),
             f"{np.mean(ratios):.3f}" if ratios else "-",
             f"{sum(x['comfort']['comfortable'] for x in m)}/{len(m)}",
             f"{np.mean([x['comfort']['max_abs_jerk'] for x in m]):.1f}",
             f"{np.mean([x['comfort']['max_lat_accel'] for x in m]):.2f}",
             f"{min(ttc):.1f} ({sum(t < 1.0 for t in ttc)})" if ttc else "-",
             f"{np.percentile(lat, 50):.0f} / {np.percentile(lat, 99):.0f}",
             f"{np.mean([r['cycles'] for r in recs]):.1f}", sum(r["budget_cuts"] for r in recs),
             sum(r["misses"] for r in recs), f"{np.mean([r['mean_tokens'] for r in recs]):.1f}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(records: list[dict], modes: list[str], latency: str, budget_ms: float) -> str:
    """Markdown: the modes over all drives, then each drive's incidents, progress and p50 latency."""
    lines = [f"closed loop, latency {latency}, budget modes at {budget_ms:g} ms", "",
             "| mode | drives | at-fault collisions | off-road drives | red-light runs | stop-sign runs | "
             "progress / expert | comfortable | mean max jerk m/s^3 | mean max lat. acc. m/s^2 | "
             "min TTC s (drives < 1 s) | latency p50 / p99 ms | plans per drive | budget cuts | misses | "
             "CoC tokens |", "|" + "---|" * 16]
    lines += [mode_row(m, [r for r in records if r["mode"] == m]) for m in modes]
    lines += ["", "| drive | " + " | ".join(modes) + " |", "|" + "---|" * (len(modes) + 1)]
    for name in dict.fromkeys(r["drive"] for r in records):
        row = {r["mode"]: r for r in records if r["drive"] == name}
        cells = []
        for m in modes:
            r = row[m]
            ratio = r["metrics"]["progress_ratio"]
            cells.append(f"{_events(r['metrics'])}, {'-' if ratio is None else f'{ratio:.2f}'}, "
                         f"{r['latency_p50_ms']:.0f} ms")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "per drive: incidents (C at-fault collisions, O off-road steps, R red-light runs, "
              "S stop-sign runs; ok = none), progress / expert, p50 latency"]
    return "\n".join(lines) + "\n"
