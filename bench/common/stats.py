"""The arithmetic of `specdrive bench`: spreads, the ideal speedup, and what holds a mode back.

Notation for one speculative mode (all times measured in the same run, on the same scenes):
    t1      ms of one plain target step (verify of width 1, measured in the plain mode)
    t_d     ms of one draft step (sum of draft-call ms / drafted tokens)
    t_v(w)  ms of one target verify of width w (mean over this mode's verify calls of width w)
    c       = t_d / t1              the draft's cost ratio
    v(w)    = t_v(w) / t1           the verify-width cost (1 for a perfectly parallel target)
    tau     = emitted / steps       tokens per target verify pass

A step of draft length k costs k*c + v(k+1) target steps, so with no loop overhead
    ideal speedup = tau / mean_steps(k_i*c + v(k_i + 1))         = tau / (1 + k*c) when v == 1
and efficiency = measured decode-phase speedup / ideal. A token-tree step (runtime/tree.py) is
priced as its d draft calls (one per depth: k = d) and one verify of its width w = 1 + nodes, so
its ideal is tau / mean(d*c + v(w)) and its acceptance factor tau / (d+1). The measured speedup factors as
    speedup = (k+1) * A * V * D * E
    A = tau / (k+1)               acceptance (1 when every draft token is accepted)
    V = 1 / v                     verify-width cost
    D = v / (k*c + v)             draft cost
    E = efficiency                loop overhead (host work between the device calls)
with k, v the step means; the smallest factor is what holds the mode back.
"""
from __future__ import annotations

import statistics

import numpy as np


def spread(values) -> dict:
    """Median, min, max of a few repeats (the spread a speed claim must show)."""
    xs = [float(x) for x in values]
    if not xs:
        return {"median": None, "min": None, "max": None, "values": []}
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4),
            "max": round(max(xs), 4), "values": [round(x, 4) for x in xs]}


def latency(values_ms) -> dict:
    """p50 / p99 / max / mean of cycle latencies in ms (p99 by linear interpolation)."""
    xs = np.asarray(list(values_ms), float)
    if xs.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    return {"p50": round(float(np.percentile(xs, 50)), 3), "p99": round(float(np.percentile(xs, 99)), 3),
            "max": round(float(xs.max()), 3), "mean": round(float(xs.mean()), 3)}


def ideal_speedup(tau: float, ks, c: float, verify_ratio, widths=None) -> float:
    """tau / mean_i(k_i*c + v(w_i)); ks: draft calls per step, verify_ratio(width) -> v, widths:
    each step's verify width (default k_i + 1: a chain after one pending token; a token tree's
    pass is pending + nodes wide, its k_i its depth)."""
    ks = list(ks)
    if not ks:
        return 0.0
    widths = [k + 1 for k in ks] if widths is None else list(widths)
    cost = float(np.mean([k * c + verify_ratio(w) for k, w in zip(ks, widths)]))
    return tau / cost


def loss_factors(tau: float, k_mean: float, c: float, v_mean: float, efficiency: float) -> dict:
    """The four factors of the measured speedup (module docstring) and the smallest one."""
    factors = {"acceptance": tau / (k_mean + 1.0), "verify_width": 1.0 / v_mean,
               "draft_cost": v_mean / (k_mean * c + v_mean), "loop_overhead": efficiency}
    out = {name: round(x, 4) for name, x in factors.items()}
    out["limited_by"] = min(factors, key=factors.get)
    return out


def verify_table(calls) -> dict:
    """{width: mean ms} of verify calls given as (width, ms) pairs."""
    by_width: dict[int, list] = {}
    for width, ms in calls:
        by_width.setdefault(int(width), []).append(float(ms))
    return {w: float(np.mean(v)) for w, v in sorted(by_width.items())}


def cost_terms(steps, t1: float) -> dict:
    """c, per-width v, mean k and mean v of one mode's recorded steps (accept_map.Step list)."""
    drafted = sum(s.k for s in steps)
    t_d = sum(s.draft_ms for s in steps) / drafted if drafted else 0.0
    table = verify_table((s.width, s.verify_ms) for s in steps)
    v = {w: ms / t1 for w, ms in table.items()}
    ks = [s.k for s in steps]
    return {"c": t_d / t1 if t1 > 0 else 0.0, "draft_step_ms": t_d, "verify_ratio": v,
            "k_mean": float(np.mean(ks)) if ks else 0.0,
            "v_mean": float(np.mean([v[s.width] for s in steps])) if steps else 1.0, "ks": ks}


def decode_speedups(plain_ms_per_repeat, mode_ms_per_repeat, plain_tokens, mode_tokens) -> list[float]:
    """Per repeat: (plain decode ms per token) / (this mode's decode ms per token)."""
    out = []
    for p_ms, m_ms, p_n, m_n in zip(plain_ms_per_repeat, mode_ms_per_repeat, plain_tokens, mode_tokens):
        if p_n and m_n and m_ms > 0:
            out.append((p_ms / p_n) / (m_ms / m_n))
    return out


def limiting_note(name: str, factors: dict, measured: float, ideal: float, tau: float, c: float) -> str:
    """One sentence naming the factor that holds a mode back, with the measured numbers."""
    what = {"acceptance": f"acceptance (tau {tau:.2f}, {factors['acceptance']:.0%} of k+1)",
            "verify_width": f"verify-width cost (a wide verify costs {1 / factors['verify_width']:.2f} "
                            "plain steps)",
            "draft_cost": f"draft cost (c = {c:.3f})",
            "loop_overhead": f"loop overhead (efficiency {factors['loop_overhead']:.0%} of ideal)"}
    return (f"{name}: {measured:.2f}x measured vs {ideal:.2f}x ideal; held back most by "
            f"{what[factors['limited_by']]}")


def mode_order(modes: list, seed: int, *where: int) -> list:
    """`modes` in the order one scene (or drive cycle) runs them: a permutation drawn from
    (seed, *where), so it differs from scene to scene and is the same in every run. Run in one
    fixed order, a mode always follows the same mode and sits at the same place in the round, so
    whatever that costs (caches the mode before it left cold, the load at that point of a round) falls
    on that mode alone; drawn per scene, it falls on every mode alike."""
    order = np.random.default_rng([seed, *where]).permutation(len(modes))
    return [modes[i] for i in order]
