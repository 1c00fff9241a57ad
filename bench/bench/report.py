"""What `specdrive bench` shows: the table it prints and the PNG pictures it writes."""
from __future__ import annotations

from pathlib import Path

from bench.common import accept_map
from bench.bench.measure import AA_SUFFIX

HEADER = (f"{'mode':<26} {'tau':>5} {'k':>4} {'c':>6} {'tok/s':>7} {'speedup (min-max)':>18} "
          f"{'ideal':>6} {'eff':>5} {'same':>7} {'vision':>7} {'prefill':>7} {'traj':>7} "
          f"{'cycle p50/p99/max ms':>22} {'cycle x':>8} {'ADE m':>6} {'miss':>4}")


def table(record: dict) -> str:
    """The bench table: one row per mode, then the note on what holds each mode back."""
    lines = [HEADER]
    for m in record["modes"]:
        sp, ident, cyc = m["decode_speedup"], m["identical"], m["cycle_ms"]
        k = m.get("k_mean", 0.0)
        cells = [f"{m['name']:<26}", f"{m['tau']:>5.2f}", f"{k:>4.1f}", _num(m.get("c"), 6, 3),
                 _num(m["tokens_per_s"]["median"], 7, 1), _speedup(sp).rjust(18),
                 _num(m.get("ideal_speedup"), 6, 2), _pct(m.get("efficiency")),
                 f"{ident['equal']}/{ident['scenes']}".rjust(7),
                 _num(m["vision_ms"]["p50"], 7, 1), _num(m["prefill_ms"]["p50"], 7, 1),
                 _num(m["trajectory_ms"]["p50"], 7, 1),
                 "/".join(_num(cyc[q], 0, 0) for q in ("p50", "p99", "max")).rjust(22),
                 _num(m["cycle_speedup"]["p50"], 7, 2) + "x", _num(m.get("ade_m"), 6, 3),
                 f"{m['deadline_misses']:>4}"]
        lines.append(" ".join(cells))
    lines += [m["note"] for m in record["modes"] if m.get("note")]
    return "\n".join(lines + [""] + host_table(record))


def host_table(record: dict) -> list[str]:
    """Where each mode's decode steps ran and what the host added to them (measure.host_terms)."""
    lines = [f"{'mode':<26} {'path (steps)':<22} {'syncs/step':>10} {'step ms':>8} {'calls ms':>8} {'host':>6}"]
    for m in record["modes"]:
        paths = ", ".join(f"{p} {n}" for p, n in sorted(m.get("paths", {}).items())) or "-"
        lines.append(f"{m['name']:<26} {paths:<22} {_num(m.get('syncs_per_step'), 10, 2)} "
                     f"{_num(m.get('step_wall_ms'), 8, 3)} {_num(m.get('step_calls_ms'), 8, 3)} "
                     f"{_pct(m.get('host_share')).rjust(6)}")
    for m in record["modes"]:
        calls = m.get("calls") or {}
        cells = [f"{kind} {size} {c['in_loop_ms']:.3f}/{c['raw_ms']:.3f} ms ({_num(c['ratio'], 0, 2)}x)"
                 for kind in ("verify", "draft") for size, c in calls.get(kind, {}).items()]
        if cells:
            lines.append(f"{m['name']}: in the loop / raw: " + "; ".join(cells))
    return lines


def markdown_table(record: dict) -> str:
    """The same numbers as a Markdown table (docs/bench.md and docs/engines.md, via `specdrive report`)."""
    rows = ["| mode | tau | mean k | c | tokens/s | decode speedup (min-max) | ideal | efficiency "
            "| same reasoning | trajectory max diff | cycle p50 / p99 ms | cycle speedup (min-max) "
            "| ADE m | limited by |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in record["modes"]:
        sp, cs = m["decode_speedup"], m["cycle_speedup"]
        rows.append(f"| {m['name']} | {m['tau']:.2f} | {m.get('k_mean', 0):.1f} | {_num(m.get('c'), 0, 3)} "
                    f"| {_num(m['tokens_per_s']['median'], 0, 0)} | {_speedup(sp).strip()} "
                    f"| {_num(m.get('ideal_speedup'), 0, 2)} | {_pct(m.get('efficiency')).strip()} "
                    f"| {m['identical']['equal']}/{m['identical']['scenes']} "
                    f"| {_num(m.get('trajectory_max_diff_m'), 0, 3)} m "
                    f"| {_num(m['cycle_ms']['p50'], 0, 0)} / {_num(m['cycle_ms']['p99'], 0, 0)} "
                    f"| {_speedup({'all': cs['p50'], 'min': cs['min'], 'max': cs['max']}).strip()} "
                    f"| {_num(m.get('ade_m'), 0, 3)} "
                    f"| {m.get('factors', {}).get('limited_by', '-')} |")
    return "\n".join(rows)


def comparison_table(record: dict, modes: list[str]) -> str:
    """A few modes side by side: cost, speed, acceptance and identity (docs/bench.md's draft-head
    and EAGLE-3 comparisons, rendered from the `make bench` record)."""
    by = {m["name"]: m for m in record["modes"]}
    rows = ["| mode | tau | c | decode speedup | ideal | alpha routine / commitment | steps at the cap | "
            "same reasoning | trajectory max diff | ADE m |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in modes:
        m, wa = by[name], record["where_accepted"].get(name, {}).get("by_class", {})
        rows.append(f"| {name} | {m['tau']:.2f} | {_num(m.get('c'), 0, 3)} | {m['decode_speedup']['all']:.2f}x "
                    f"| {_num(m.get('ideal_speedup'), 0, 2)} | {_f(wa.get('routine', {}).get('accept_rate'), pct=True)} / "
                    f"{_f(wa.get('commitment', {}).get('accept_rate'), pct=True)} "
                    f"| {_f((m.get('free_running') or {}).get('at_cap'), pct=True)} "
                    f"| {m['identical']['equal']}/{m['identical']['scenes']} "
                    f"| {_num(m.get('trajectory_max_diff_m'), 0, 3)} m | {_num(m.get('ade_m'), 0, 3)} |")
    return "\n".join(rows)


def _num(x, width: int, digits: int) -> str:
    """x to `digits` places, or "-" where a mode measured nothing (no successful cycle: None, NaN)."""
    return ("-" if x is None or x != x else f"{x:.{digits}f}").rjust(width)


def _speedup(sp: dict) -> str:
    """"2.41x (2.30-2.52)", or "-" for a mode with no successful cycle (no decode speedup)."""
    if sp["all"] is None:
        return "-"
    return f"{sp['all']:>6.2f}x ({_num(sp['min'], 0, 2)}-{_num(sp['max'], 0, 2)})"


def _pct(x) -> str:
    return ("-" if x is None else f"{x:.0%}").rjust(5)


def plot_bench(path: Path, record: dict) -> None:
    """Left: decode-phase speedup per mode (all repeats, min-max bar) beside the ideal. Right: tau of
    routine vs commitment tokens per speculative mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    spec = [m for m in record["modes"] if m["name"] != "plain"]
    names = [m["name"] for m in spec]
    y = np.arange(len(spec))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 1.2 + 0.42 * len(spec)), sharey=True)
    med, err = _bars([m["decode_speedup"] for m in spec])
    names = [n if m["decode_speedup"]["all"] is not None else f"{n} (-: no successful cycle)"
             for n, m in zip(names, spec)]
    ax1.barh(y, med, xerr=err, color="#3a9a4a", label="measured (all repeats; min-max of repeats)")
    ax1.scatter([m.get("ideal_speedup", 0) for m in spec], y, marker="|", s=300, color="black",
                label="ideal tau / (k c + v(k+1))", zorder=3)
    ax1.axvline(1.0, color="#888", lw=1, ls="--")
    ax1.set_yticks(y, names)
    ax1.invert_yaxis()
    ax1.set_xlabel("decode-phase speedup over plain target decoding")
    ax1.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    for j, cls in enumerate(accept_map.CLASSES):
        taus = [record["where_accepted"][m["name"]]["by_class"][cls]["tau"] or 0 for m in spec]
        ax2.barh(y + (j - 0.5) * 0.38, taus, height=0.38, label=cls,
                 color=("#3b6fd4", "#e07b22")[j])
    ax2.set_xlabel("tau (tokens per target pass)")
    ax2.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    fig.suptitle(_title(record), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(speedups: list[dict]):
    """(medians, min-max error bars (2, n)) of decode speedups; a mode without one: no bar (0, 0)."""
    import numpy as np

    med = np.array([sp["all"] or 0.0 for sp in speedups])
    lo = [sp["min"] if sp["min"] is not None else x for sp, x in zip(speedups, med)]
    hi = [sp["max"] if sp["max"] is not None else x for sp, x in zip(speedups, med)]
    return med, np.array([[max(x - a, 0), max(b - x, 0)] for x, a, b in zip(med, lo, hi)]).T


def _title(record: dict) -> str:
    s, mach = record.get("setup", {}), record.get("machine", {})
    return (f"{s.get('source', '')}  backend {s.get('backend', '')} ({s.get('device', '')}), "
            f"{s.get('scenes')} scenes x {s.get('repeats')} repeats, greedy; "
            f"{mach.get('cpu', '')}, {mach.get('torch_threads', '?')} thread(s)")


def plot_where(path: Path, record: dict, mode: str, scene_index: int = 0) -> str:
    """The CoC of one scene under `mode`, each word colored by who produced it. Returns the
    scene's name."""
    cycles = [c for c in record["cycles"] if c["mode"] == mode]
    c = cycles[min(scene_index, len(cycles) - 1)]
    wa = record["where_accepted"][mode]["by_class"]
    rates = ", ".join(f"{cls} tau {wa[cls]['tau'] or 0:.2f} accept {wa[cls]['accept_rate'] or 0:.0%}"
                      for cls in accept_map.CLASSES)
    title = f"{mode}, scene {c['scene']} ({c['family']}); over all scenes: {rates}"
    accept_map.plot_scene(path, c["words"], c["labels"], c["classes"], title)
    return c["scene"]


def best_mode(record: dict) -> str | None:
    """The speculative mode with the highest decode speedup (all repeats) among those whose output
    equals plain decoding on every scene (None if there is none)."""
    ok = [m for m in record["modes"][1:] if m["identical"]["fraction"] == 1.0
          and m["decode_speedup"]["all"] is not None and not m["name"].endswith(AA_SUFFIX)]
    return max(ok, key=lambda m: m["decode_speedup"]["all"])["name"] if ok else None


def aa_lines(record: dict) -> list[str]:
    """One line per A/A control (`bench --aa`): the two identical modes' speedups and their gap."""
    return [f"A/A control: {a['mode']} measured {a['speedup']:.2f}x and its copy {a['copy_speedup']:.2f}x, "
            f"a gap of {100 * a['gap']:.1f} %: differences between modes this small are within this run's noise"
            for a in record.get("aa", []) if a["gap"] is not None]


def markdown_report(record: dict) -> str:
    """The bench table, where the best mode's draft is accepted, the notes and the setup, as
    Markdown (written beside the JSON; docs/bench.md quotes it)."""
    best, s, mach = record.get("best"), record.get("setup", {}), record.get("machine", {})
    lines = [markdown_table(record), ""]
    if best:
        wa = record["where_accepted"][best]
        lines += [f"Where the draft is accepted ({best}):", "",
                  "| tokens | count | tau | acceptance rate | draft share |", "|---|---|---|---|---|"]
        lines += [_where_row(cls, wa["by_class"][cls]) for cls in accept_map.CLASSES]
        lines += ["", "| family | tokens | tau | acceptance rate | routine tau | commitment tau |",
                  "|---|---|---|---|---|---|"]
        for fam, st in wa["by_family"].items():
            lines.append(f"| {fam} | {st['all']['tokens']} | {_f(st['all']['tau'])} "
                         f"| {_f(st['all']['accept_rate'], pct=True)} | {_f(st['routine']['tau'])} "
                         f"| {_f(st['commitment']['tau'])} |")
        lines.append("")
    lines += acceptance_table(record)
    lines += [f"- {m['note']}" for m in record["modes"] if m.get("note")]
    lines += [f"- {line}" for line in aa_lines(record)]
    lines += ["", f"Setup: {s.get('source')}, backend {s.get('backend')} on {s.get('device')}, "
              f"{s.get('scenes')} scenes (seed {s.get('seed')}, split {s.get('split')}) x {s.get('repeats')} "
              f"repeats after {s.get('warmup')} warm-up cycle(s) per mode, greedy, budget "
              f"{s.get('budget_ms') or 'off'}, deadline {s.get('deadline_ms')} ms; plain target step "
              f"{record.get('target_step_ms')} ms. Machine: {mach.get('cpu')}, {mach.get('cpu_count')} "
              f"CPUs, torch {mach.get('torch')} with {mach.get('torch_threads')} thread(s)"
              + (f", GPU {mach['gpu']}" if mach.get("gpu") else "") + ".",
              "", f"Command: `{s.get('command')}`"]
    return "\n".join(lines) + "\n"


def acceptance_table(record: dict) -> list[str]:
    """Per speculative mode: tau, per-token acceptance (alpha) of routine and commitment tokens,
    and at fixed k the free-running length (accepted per step, share of steps at the cap)."""
    rows = ["| mode | tau | alpha routine | alpha commitment | accepted per step | steps at the cap k |",
            "|---|---|---|---|---|---|"]
    for m in record["modes"][1:]:
        wa = record["where_accepted"].get(m["name"], {}).get("by_class", {})
        fr = m.get("free_running") or {}
        rows.append(f"| {m['name']} | {m['tau']:.2f} | {_f(wa.get('routine', {}).get('accept_rate'), pct=True)} "
                    f"| {_f(wa.get('commitment', {}).get('accept_rate'), pct=True)} "
                    f"| {_f(fr.get('accepted_per_step'))} | {_f(fr.get('at_cap'), pct=True)} |")
    return ["Acceptance per mode (alpha: accepted / judged proposals, the first rejection of a step "
            "included):", "", *rows, ""]


def _where_row(cls: str, st: dict) -> str:
    return (f"| {cls} | {st['tokens']} | {_f(st['tau'])} | {_f(st['accept_rate'], pct=True)} "
            f"| {_f(st['draft_share'], pct=True)} |")


def _f(x, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:.0%}" if pct else f"{x:.2f}"


def criterion(record: dict, speedup: float = 2.5, efficiency: float = 0.85) -> dict:
    """Issue 6's bar for the best draft: decode-phase speedup >= 2.5x with the same output on
    every scene and efficiency >= 85% of the ideal; and, when short, the factor that holds it back."""
    best = record.get("best")
    m = next((x for x in record["modes"] if x["name"] == best), None)
    if m is None or "efficiency" not in m:
        return {"met": False, "why": "no speculative mode with the same output as plain decoding"}
    out = {"mode": best, "speedup": m["decode_speedup"]["all"], "efficiency": m["efficiency"],
           "identical": m["identical"]["fraction"] == 1.0, "want_speedup": speedup,
           "want_efficiency": efficiency}
    out["met"] = bool(out["identical"] and out["speedup"] >= speedup and out["efficiency"] >= efficiency)
    out["limited_by"] = m["factors"]["limited_by"]
    return out
