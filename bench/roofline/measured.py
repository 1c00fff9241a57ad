"""`specdrive roofline --measured FILE`: the roofline against a measured floor (bench/roofline/floor.py).

    read_floor(path, preset) -> the floor record (ConfigError when it is not one, or of another preset)
    compare(cfg, dev, floor, precision) -> rows: every call kind, predicted ms (the device's
        datasheet peaks and its assumed efficiencies) against measured, with the ratio
    efficiencies(dev, floor, precision) -> {"memory_efficiency", "compute_efficiency", "from"}
    calibrated(dev, eff) -> the Device with those efficiencies (the Orin / Thor projections)
    VerifyCurve(floor)(width) -> ms: the measured target widths, linear between them

Efficiencies from a measurement (documented in docs/usage.md): the bandwidth one decode step
reached, bytes it must move over its time, as a share of the *datasheet* bandwidth of the device
it ran on (`--device`, e.g. h200), and the arithmetic rate the prefill reached as a share of that
device's datasheet peak at the measured precision. A projection of another device (Orin, Thor)
then assumes its engine reaches the same shares of its own datasheet peaks: a transfer of
shares between devices, not a measurement of them. Each prediction prices exactly the work the
floor timed: the same widths, valid cache rows, logits rows (every row of the torch forward) and
prompt rows, so a ratio says how far the model of time (bytes and FLOPs over peaks) is off, not
how the workloads differ.
"""
from __future__ import annotations

import dataclasses
import math

from bench.common.costs import Device, Shapes
from core.config import ConfigError, read_json
from core.graphs import DRAFT_CHAIN, DRAFT_FEED

DTYPE_PRECISION = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
KINDS = (DRAFT_FEED, DRAFT_CHAIN, "vision", "prefill", "expert")


def read_floor(path, preset: str) -> dict:
    rec = read_json(path, "--measured floor")
    ok = isinstance(rec, dict) and isinstance(rec.get("calls"), dict) and isinstance(rec["calls"].get("target"), dict) \
        and rec["calls"]["target"] and all(k in rec["calls"] for k in KINDS) and "copy_gbps" in rec
    if not ok:
        raise ConfigError(f"--measured {str(path)!r}: not a floor record of `python -m tools.measure_c --floor` "
                          "(needs 'calls' with target widths and draft_feed, draft_chain, vision, prefill, expert)")
    if rec.get("preset") != preset:
        raise ConfigError(f"--measured {str(path)!r} measured preset {rec.get('preset')!r}; this roofline is of "
                          f"{preset!r} (pass --preset {rec.get('preset')})")
    return rec


def call_costs(cfg, floor: dict, precision: str, impl: str = "engine") -> dict:
    """{call name: Cost} of exactly the work each measured call did (module docstring)."""
    s, L, cached = Shapes(cfg, precision, impl), floor["max_len"], floor["cached"]
    c = floor["calls"]
    out = {f"target width {w}": s.target(int(w), cached + int(w), L, int(w)) for w in c["target"]}
    out[DRAFT_FEED] = s.draft(1, cached + 1, L, 1)
    out[DRAFT_CHAIN] = s.draft(1, cached + 1, L, 1, fc=False)
    out["vision"] = s.vision(c["vision"]["images"], tuple(c["vision"]["image_hw"]))
    rows = c["prefill"]["rows"]
    prefill = s.target(rows, rows, L, rows)
    prefill.extend(s.draft(rows, rows, L, rows))
    out["prefill"] = prefill
    out["expert"] = s.expert(c["expert"]["samples"], c["expert"]["ctx"])
    return out


def measured_ms(floor: dict) -> dict:
    c = floor["calls"]
    return {**{f"target width {w}": v["ms"] for w, v in c["target"].items()}, **{k: c[k]["ms"] for k in KINDS}}


def compare(cfg, dev: Device, floor: dict, precision: str) -> list[dict]:
    costs, got = call_costs(cfg, floor, precision, dev.impl), measured_ms(floor)
    step = got[f"target width {min(int(w) for w in floor['calls']['target'])}"]
    rows = []
    for name, cost in costs.items():
        pred = cost.ms(dev, precision)
        rows.append({"call": name, "measured_ms": got[name], "predicted_ms": pred,
                     "measured_over_predicted": got[name] / pred if pred else None,
                     "measured_steps": got[name] / step,
                     "within_25pct": bool(pred and abs(got[name] / pred - 1) <= 0.25)})
    return rows


def efficiencies(dev: Device, floor: dict, precision: str) -> dict:
    """The shares of the measured device's datasheet peaks the floor reached (module docstring):
    memory from the narrowest target step, compute from the prefill. Clipped to 0.001..1."""
    c = floor["calls"]
    w = min(c["target"], key=int)
    step, prefill = c["target"][w], c["prefill"]
    mem = step["bytes"] / (step["ms"] * 1e-3) / (dev.dram_gbps * 1e9)
    comp = prefill["flops"] / (prefill["ms"] * 1e-3) / dev.peak_flops(precision)
    clip = lambda x: min(max(x, 1e-3), 1.0)      # noqa: E731
    return {"memory_efficiency": clip(mem), "compute_efficiency": clip(comp),
            "from": f"target width {w} step ({step['ms']:.3f} ms, {step['bytes'] / 1e6:.1f} MB) and the prefill "
                    f"({prefill['ms']:.2f} ms, {prefill['flops'] / 1e12:.2f} TFLOP) on {dev.title}"}


def calibrated(dev: Device, eff: dict) -> Device:
    return dataclasses.replace(dev, memory_efficiency=eff["memory_efficiency"],
                               compute_efficiency=eff["compute_efficiency"], impl="engine")


class VerifyCurve:
    """ms of a target forward of `width` tokens from the measured widths: linear between the two
    measured widths around it, and along the last two beyond the widest (a width below the
    narrowest measured one takes the narrowest's time)."""

    def __init__(self, floor: dict):
        pts = sorted((int(w), v["ms"]) for w, v in floor["calls"]["target"].items())
        self.w, self.ms = [p[0] for p in pts], [p[1] for p in pts]

    def __call__(self, width: float) -> float:
        w, ms = self.w, self.ms
        if len(w) == 1 or width <= w[0]:
            return ms[0]
        i = next((j for j in range(1, len(w)) if width <= w[j]), len(w) - 1)
        a, b = i - 1, i
        return ms[a] + (ms[b] - ms[a]) * (width - w[a]) / (w[b] - w[a])


def measured_prices(floor: dict, k: int) -> dict:
    """What --trees prices from the floor: the verify curve and the draft's cost per proposal of
    a k-long chain (one feed, k - 1 chain steps)."""
    c = floor["calls"]
    k = max(k, 1)
    return {"verify": VerifyCurve(floor),
            "draft_step": (c[DRAFT_FEED]["ms"] + (k - 1) * c[DRAFT_CHAIN]["ms"]) / k,
            DRAFT_FEED: c[DRAFT_FEED]["ms"], DRAFT_CHAIN: c[DRAFT_CHAIN]["ms"]}


def format_compare(rows: list[dict], floor: dict, dev: Device, eff: dict, others: list[dict]) -> str:
    lines = [f"measured ({floor.get('device_name', floor['device'])}, {floor['dtype']}, {floor['path']} path, "
             f"{'CUDA graphs' if floor['graphs'] else 'eager'}; copy {floor['copy_gbps']:.0f} GB/s) against the "
             f"roofline of {dev.title} (compute x{dev.compute_efficiency}, bandwidth x{dev.memory_efficiency})",
             "| call | measured ms | predicted ms | measured / predicted | steps | within 25 % |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["measured_over_predicted"] is None else f"{r['measured_over_predicted']:.2f}"
        lines.append(f"| {r['call']} | {r['measured_ms']:.3f} | {r['predicted_ms']:.3f} | {ratio} | "
                     f"{r['measured_steps']:.2f} | {'yes' if r['within_25pct'] else 'no'} |")
    lines.append(f"measured efficiencies: bandwidth x{eff['memory_efficiency']:.3f}, compute "
                 f"x{eff['compute_efficiency']:.3f} (from the {eff['from']})")
    for o in others:
        lines.append(f"{o['device']} with the measured efficiencies: speculative cycle {o['measured_eff_ms']:.1f} ms "
                     f"(datasheet assumptions: {o['assumed_eff_ms']:.1f} ms; {o['precision']})")
    return "\n".join(lines)


def check_finite(rows: list[dict]) -> None:
    bad = [r["call"] for r in rows if not math.isfinite(r["measured_ms"]) or r["measured_ms"] <= 0]
    if bad:
        raise ConfigError(f"--measured: calls {bad} have no positive finite time")

