"""Pictures of a run's cycles (the cycles.jsonl that `specdrive plan` and `specdrive profile` write).

timeline.png   one bar per cycle, its stages end to end in the order a cycle runs them, the
               deadline as a line; budget cuts and fallback trajectories marked
stages.png     the latency distribution of every stage over the cycles
accepted.png   accepted draft tokens per speculative step, routine vs commitment: a step counts
               as the class of the first token it emitted (the cycle's "routine_tokens", which
               `specdrive plan` logs from the language's parser; a log without it counts every
               token as commitment)
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.common.accept_map import token_classes
from core.config import ConfigError

COLORS = {"prompt": "#8c564b", "vision": "#6b4fa8", "prefill": "#3b6fd4", "fallback": "#e0a422", "fallback_wait": "#b0b0b0",
          "reasoning": "#3a9a4a", "expert_wait": "#c8c8c8", "trajectory": "#e07b22"}


def load_cycles(path: Path, warn=print) -> list[dict]:
    """The cycle records of a cycles.jsonl. A line that is not a JSON cycle record (garbage, a
    truncated last line, binary bytes) is skipped and counted (`warn` says how many); a file
    with no record at all is refused (ConfigError)."""
    cycles, bad = [], []
    for i, line in enumerate(Path(path).read_bytes().decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict) and is_cycle(rec):
            cycles.append(rec)
        else:
            bad.append(i)
    if not cycles:
        raise ConfigError(f"{path}: no cycle records (JSON lines of `specdrive plan` or `specdrive profile`); "
                          f"{len(bad)} lines are something else")
    if bad:
        warn(f"{path}: skipped {len(bad)} lines that are not cycle records (first: line {bad[0]})")
    return cycles


def is_cycle(rec: dict) -> bool:
    """A record the pictures can draw: an int cycle, timing (if any) with numeric stages."""
    timing = rec.get("timing") or {}
    stages = timing.get("stages_ms", {}) if isinstance(timing, dict) else None
    return (type(rec.get("cycle")) is int and isinstance(stages, dict)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in stages.values()))


STAGE_ORDER = ("fallback_wait", "prompt", "vision", "prefill", "fallback", "reasoning", "expert_wait", "trajectory")


def segments(cycle: dict) -> list[tuple[str, float, float]]:
    """(stage, start ms, duration ms) laid end to end in the order a cycle runs them (the JSON
    log sorts its keys; a stage not in STAGE_ORDER goes last)."""
    t, out = 0.0, []
    stages = (cycle.get("timing") or {}).get("stages_ms", {})
    rank = {n: i for i, n in enumerate(STAGE_ORDER)}
    for name, ms in sorted(stages.items(), key=lambda kv: rank.get(kv[0], len(rank))):
        out.append((name, t, float(ms)))
        t += float(ms)
    return out


def step_classes(cycle: dict) -> list[tuple[int, str]]:
    """(accepted tokens, routine|commitment) per speculative step of the reasoning."""
    dec = cycle.get("decode") or {}
    n_tokens = len(cycle.get("reasoning_ids") or []) + 1
    classes = token_classes(n_tokens, int(cycle.get("routine_tokens") or 0))
    out, pos = [], 1                           # token 0 came from the prefill
    for k, n in zip(dec.get("ks", []), dec.get("ns", [])):
        if k:
            out.append((int(n), classes[pos] if pos < len(classes) else "commitment"))
        pos += int(n) + 1
    return out


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_timeline(cycles: list[dict], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.28 * len(cycles)))
    seen = set()
    for i, c in enumerate(cycles):
        for name, t0, ms in segments(c):
            ax.barh(i, ms, left=t0, color=COLORS.get(name, "#888"), edgecolor="white", linewidth=0.4,
                    label=None if name in seen else name)
            seen.add(name)
        total = (c.get("timing") or {}).get("total_ms", 0.0)
        marks = [m for m in ("budget_cut", "fallback", "miss") if m in c.get("flags", [])]
        if marks:
            ax.text(total, i, " " + ",".join(marks), va="center", fontsize=7, color="#c22")
    budgets = {(c.get("timing") or {}).get("budget_ms") for c in cycles} - {None}
    for b in budgets:
        ax.axvline(b, color="#c22", linestyle="--", linewidth=1.2, label=f"deadline {b:g} ms")
    ax.set_yticks(range(len(cycles)), [str(c.get("cycle")) for c in cycles], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the cycle began")
    ax.set_ylabel("cycle")
    ax.legend(fontsize=7, loc="lower right", ncols=3)
    ax.set_title("cycle timeline against the budget (stages end to end; red: cuts, fallbacks, misses)",
                 fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_stages(cycles: list[dict], path: Path) -> None:
    plt = _plt()
    by: dict[str, list] = {}
    for c in cycles:
        for name, _, ms in segments(c):
            by.setdefault(name, []).append(ms)
        by.setdefault("cycle", []).append((c.get("timing") or {}).get("total_ms", 0.0))
    names = list(by)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.boxplot([by[n] for n in names], whis=(1, 99), showfliers=True)
    ax.set_xticks(range(1, len(names) + 1), names, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (box: quartiles, whiskers: p1-p99)")
    ax.set_title(f"per-stage latency over {len(cycles)} cycles", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accepted(cycles: list[dict], path: Path) -> dict:
    """Histogram of accepted tokens per step by class; returns {class: mean accepted}."""
    plt = _plt()
    steps = [s for c in cycles for s in step_classes(c)]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    means = {}
    top = max([n for n, _ in steps], default=0)
    for cls, color in (("routine", "#3a9a4a"), ("commitment", "#3b6fd4")):
        ns = [n for n, c in steps if c == cls]
        if ns:
            means[cls] = float(np.mean(ns))
            ax.hist(ns, bins=np.arange(top + 2) - 0.5, alpha=0.6, color=color,
                    label=f"{cls}: {len(ns)} steps, mean {means[cls]:.2f}")
    ax.set_xlabel("accepted draft tokens in the step")
    ax.set_ylabel("steps")
    ax.legend(fontsize=8)
    ax.set_title("accepted length per speculative step", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return means


def draw_all(cycles: list[dict], out: Path) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_timeline(cycles, out / "timeline.png")
    plot_stages(cycles, out / "stages.png")
    return {"timeline": str(out / "timeline.png"), "stages": str(out / "stages.png"),
            "accepted_mean": plot_accepted(cycles, out / "accepted.png")}
