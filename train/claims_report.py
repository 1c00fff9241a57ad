"""Tables and pictures of the seed's claims from an evaluation's metrics.json (train.evaluate with
per-scene records): drafts grouped by variant over seeds, intervals over scenes, paired
differences, attention mass by key type, alpha by position, action quality under a budget.

    write(metrics_json, out_md, img_dir)     -> the markdown file (every number from metrics_json)

A draft's group and seed come from its folder: RUN/<group>-s<seed>/ckpt/draft-* (a distillation
or AARL run folder), else its own name (a shipped draft-<variant>, seed "shipped").
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from train import claims

KINDS = ("history", "vision", "text")


def group_of(name: str) -> tuple[str, str]:
    """(group, seed) of a draft name or path."""
    p = Path(name)
    if p.parent.name == "ckpt":
        run = p.parent.parent.name
        m = re.fullmatch(r"(.*?)-s(\d+)", run)
        group, seed = (m.group(1), m.group(2)) if m else (run, "0")
        return (f"aarl {group}" if "aarl" in p.name else group), seed
    return p.name.removeprefix("draft-"), "shipped"


def grouped(drafts: dict) -> dict:
    """{group: {seed: draft numbers}} in first-seen order."""
    out: dict = {}
    for name, n in drafts.items():
        g, s = group_of(name)
        out.setdefault(g, {})[s] = n
    return out


def pooled(seeds: dict) -> list[dict]:
    """Per-scene records summed over seeds (the same scenes in each), for a seed-pooled bootstrap."""
    runs = [n["per_scene"] for n in seeds.values()]
    out = []
    for recs in zip(*runs):
        out.append({key: [sum(r[key][i] for r in recs) for i in range(2)] for key in ("routine", "commitment", "free")}
                   | {"n": sum(r["n"] for r in recs), "f": sum(r["f"] for r in recs)})
    return out


def _ci(x, pct=False) -> str:
    if pct:
        return f"{x[0]:.1%} [{x[1]:.1%}, {x[2]:.1%}]"
    return f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]"


def acceptance_table(splits: dict) -> list[str]:
    rows = ["| split | draft | seeds | tau k=8 (per seed) | tau k=8 [95%] | alpha routine [95%] | "
            "alpha commitment [95%] | free-running [95%] | draft share of CoC | tokens per accepted block | "
            "routine-labelled share of CoC |", "|" + "---|" * 11]
    for split, s in splits.items():
        for g, seeds in grouped(s["drafts"]).items():
            iv = claims.intervals(pooled(seeds))
            n = sum(r["n"] for d in seeds.values() for r in d["per_scene"])
            f = sum(r["f"] for d in seeds.values() for r in d["per_scene"])
            per = ", ".join(f"{d['tau']:.2f}" for d in seeds.values())
            one = next(iter(seeds.values()))["per_scene"]          # labels are the scenes', not the draft's
            routine = sum(r["routine"][1] for r in one) / max(sum(r["routine"][1] + r["commitment"][1] for r in one), 1)
            rows.append(f"| {split} | {g} | {len(seeds)} | {per} | {_ci(iv['tau'])} | {_ci(iv['alpha_routine'], True)} | "
                        f"{_ci(iv['alpha_commitment'], True)} | {_ci(iv['free_running'])} | {(n - f) / max(n, 1):.1%} | "
                        f"{(n - f) / max(f, 1):.2f} | {routine:.1%} |")
    return rows


def tau_diff(a: dict, b: dict, seed: int = 0) -> list[float]:
    """tau(b) - tau(a) over the same scenes (seed-pooled ratios), with a paired bootstrap interval."""
    pa, pb = pooled(a), pooled(b)
    na, fa = np.array([r["n"] for r in pa], float), np.array([r["f"] for r in pa], float)
    nb, fb = np.array([r["n"] for r in pb], float), np.array([r["f"] for r in pb], float)
    idx = np.random.default_rng(seed).integers(0, len(pa), size=(claims.BOOT, len(pa)))
    boot = claims.ratio(nb, fb, idx) - claims.ratio(na, fa, idx)
    lo, hi = np.quantile(boot, [(1 - claims.LEVEL) / 2, (1 + claims.LEVEL) / 2])
    return [float(nb.sum() / fb.sum() - na.sum() / fa.sum()), float(lo), float(hi)]


COMPARISONS = (("mrope", "flat", "FlatRoPE vs M-RoPE, fused drafts"),
               ("mrope-standalone", "flat-standalone", "FlatRoPE vs M-RoPE, standalone drafts (features: none)"),
               ("flat", "aarl rollout", "AARL (shipped recipe) vs its distilled flat seed"))


def scene_attention(seeds: dict, kind: str) -> np.ndarray:
    """Per scene: attention mass on `kind` keys (mean over layers), averaged over seeds."""
    return np.mean([[np.mean(r["attn"][kind]) for r in n["per_scene"]] for n in seeds.values()], 0)


def seed_label(seed) -> str:
    """s0, s1, ... for a distillation seed; a shipped draft's "shipped" as it is."""
    return f"s{seed}" if str(seed).isdigit() else str(seed)


def comparison_table(splits: dict) -> list[str]:
    """Every comparison of COMPARISONS on every split: tau at k = 8, b minus a, with the seed-level
    interval (seeds and shared scenes: train.claims.hierarchical_diff), Holm's adjusted p over all the
    rows, the effect the row could have detected and its verdict; the scene-level interval (seeds
    pooled) and the attention differences beside them."""
    found = []
    for split, s in splits.items():
        g = grouped(s["drafts"])
        for a, b, what in COMPARISONS:
            if a in g and b in g:
                seeds = sorted(set(g[a]) & set(g[b]))
                found.append((split, what, {k: g[a][k] for k in seeds}, {k: g[b][k] for k in seeds}))
    tests = claims.verdicts([claims.hierarchical_diff(sa, sb) for _, _, sa, sb in found])
    rows = ["| split | comparison | tau k=8 difference, seed-level [95%] | p (Holm) | detectable | verdict | "
            "scene-level [95%] (seeds pooled) | history-key mass difference [95%] | vision-key mass difference [95%] | "
            "per seed: tau / history / vision differences |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (split, what, sa, sb), t in zip(found, tests):
        d = tau_diff(sa, sb)
        h, v = (claims.paired(scene_attention(sa, kind), scene_attention(sb, kind)) for kind in ("history", "vision"))
        per = "; ".join(f"{seed_label(k)}: {sb[k]['tau'] - sa[k]['tau']:+.2f} / "
                        f"{sb[k]['attn_history'] - sa[k]['attn_history']:+.3f} / "
                        f"{sb[k]['attn_vision'] - sa[k]['attn_vision']:+.3f}" for k in sa)
        rows.append(f"| {split} | {what} ({t['seeds']} paired seeds x {t['scenes']} shared scenes) | "
                    f"{t['point']:+.2f} [{t['lo']:+.2f}, {t['hi']:+.2f}] | {t['p_holm']:.3f} | "
                    f"±{t['detectable']:.2f} | {t['verdict']} | {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}] | "
                    f"{h[0]:+.3f} [{h[1]:+.3f}, {h[2]:+.3f}] | {v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}] | {per} |")
    return rows


CLAIMS = (  # (claim, the paper's words, group a, group b): b - a predicted positive
    ("FlatRoPE raises acceptance (fused drafts)", "flat > mrope in accepted length", "mrope", "flat"),
    ("FlatRoPE raises acceptance (standalone drafts)", "flat > mrope in accepted length", "mrope-standalone",
     "flat-standalone"),
    ("AARL raises accepted length (shipped recipe)", "an action reward with a KL anchor raises accepted length",
     "flat", "aarl rollout"),
)
ATTENTION = (("FlatRoPE turns attention to the history (fused)", "mrope", "flat"),
             ("FlatRoPE turns attention to the history (standalone)", "mrope-standalone", "flat-standalone"))
PAPER_BLOCK = 4.6     # "~78 % of CoC tokens from the draft, in blocks of ~4.6": compared as tau


def _design(t: dict) -> str:
    """The seeds x scenes cell, naming the bootstrap design (train.claims SHARED or NESTED)."""
    return f"{t['seeds']} x {t['scenes']} ({'shared scenes' if t['design'] == claims.SHARED else 'scenes per seed'})"


def _cell(t: dict, fmt: str = "+.2f") -> str:
    return f"{t['point']:{fmt}} [{t['lo']:{fmt}}, {t['hi']:{fmt}}]"


def verdict_table(splits: dict) -> list[str]:
    """Each claim with its seed-level interval (train.claims: seeds and shared scenes), Holm's adjusted p
    within its family (the tau comparisons; the attention comparisons), the effect the row could
    have detected, and its verdict. The block claim: the flat draft's tau against 4.6, two-sided."""
    tau_rows, attn_rows = [], []
    for split, s in splits.items():
        g = grouped(s["drafts"])
        for claim, words, a, b in CLAIMS:
            if a in g and b in g:
                tau_rows.append((claim, words, split, claims.hierarchical_diff(g[a], g[b])))
        if split == "test":
            for claim, a, b in ATTENTION:
                if a in g and b in g:
                    attn_rows.append((claim, "1D positions move the draft's attention onto the history tokens", split,
                                      claims.hierarchical_mean_diff(g[a], g[b], lambda r: np.mean(r["attn"]["history"]))))
    rows = ["| claim | the paper says | split | ours: difference, seed-level [95%] | seeds x scenes | p (Holm) | "
            "detectable | verdict |", "|---|---|---|---|---|---|---|---|"]
    for family, fmt in ((tau_rows, "+.2f"), (attn_rows, "+.3f")):
        for (claim, words, split, _), t in zip(family, claims.verdicts([r[3] for r in family])):
            rows.append(f"| {claim} | {words} | {split} | {_cell(t, fmt)} | {_design(t)} | "
                        f"{t['p_holm']:.3f} | ±{t['detectable']:{fmt[1:]}} | {t['verdict']} |")
    for split, s in splits.items():
        flat = grouped(s["drafts"]).get("flat")
        if flat:
            t = claims.hierarchical_tau(flat, PAPER_BLOCK)
            verdict = "not resolved at this power" if t["p"] >= 0.05 else \
                ("holds: more than the paper's" if t["point"] > PAPER_BLOCK else "does not hold: fewer")
            rows.append(f"| the routine reasoner writes most of the CoC in long blocks | ~78 % of CoC tokens, blocks "
                        f"of ~{PAPER_BLOCK} (compared as tau) | {split} | flat tau {_cell(t, '.2f')} | "
                        f"{_design(t)} | {t['p']:.3f} (one test) | - | {verdict} |")
    return rows


def attention_table(splits: dict, split: str = "test") -> list[str]:
    rows = ["| draft | layer | history | vision | text |", "|---|---|---|---|---|"]
    for g, seeds in grouped(splits[split]["drafts"]).items():
        layers = np.mean([[n["attn_layers"][k] for k in KINDS] for n in seeds.values()], 0)   # (3, L)
        for layer in range(layers.shape[1]):
            rows.append(f"| {g} | {layer} | " + " | ".join(f"{layers[i, layer]:.3f}" for i in range(3)) + " |")
    return rows


def budget_table(splits: dict) -> list[str]:
    """Per split and budget: plain decoding, every draft group (per-scene values averaged over its
    seeds) and the full CoC (no budget)."""
    rows = ["| split | passes | mode | seeds | CoC tokens written | ADE (m) [95%] | cause and decision right |",
            "|---|---|---|---|---|---|---|"]
    for split, s in splits.items():
        b = s.get("budget_action")
        if not b:
            continue
        groups: dict = {}
        for mode in b["modes"]:
            if mode not in ("plain", "full"):
                groups.setdefault(group_of(mode)[0], []).append(mode)
        for p in map(str, b["passes"]):
            for label, modes in [("plain", ["plain"]), *groups.items()]:
                per = [b["modes"][m][p] for m in modes]
                ade = np.mean([r["ade_scenes"] for r in per], 0)
                rows.append(f"| {split} | {p} | {label} | {len(modes) if label != 'plain' else '-'} | "
                            f"{np.mean([r['tokens'] for r in per]):.1f} | {_ci(claims.mean_interval(ade))} | "
                            f"{np.mean([r['commitment'] for r in per]):.1%} |")
        full = b["modes"]["full"]["0"]
        rows.append(f"| {split} | no budget | full CoC | - | {full['tokens']:.1f} | "
                    f"{_ci(claims.mean_interval(full['ade_scenes']))} | {full['commitment']:.1%} |")
    return rows


def aarl_table(splits: dict, base: str = "flat", passes: str = "4") -> list[str]:
    """Every AARL run against the distilled flat draft it started from (same seed): tau, and the
    budgeted ADE and commitment at `passes` passes, as paired differences over the same scenes."""
    rows = [f"| split | AARL run | seed | tau k=8 change [95%] | ADE change at {passes} passes (m) [95%] | "
            f"cause and decision change at {passes} passes [95%] |", "|---|---|---|---|---|---|"]
    for split, s in splits.items():
        g = grouped(s["drafts"])
        names = {group_of(n): n for n in s["drafts"]}
        b = s.get("budget_action", {}).get("modes", {})
        for group, seeds in g.items():
            if not group.startswith("aarl") or base not in g:
                continue
            for seed in seeds:
                if seed not in g[base]:
                    continue
                d = tau_diff({seed: g[base][seed]}, {seed: seeds[seed]})
                ra, rb = b.get(names[(base, seed)], {}).get(passes), b.get(names[(group, seed)], {}).get(passes)
                ade = claims.paired(ra["ade_scenes"], rb["ade_scenes"]) if ra and rb else [float("nan")] * 3
                com = claims.paired(ra["commitment_scenes"], rb["commitment_scenes"]) if ra and rb else [float("nan")] * 3
                rows.append(f"| {split} | {group} | {seed} | {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}] | "
                            f"{ade[0]:+.3f} [{ade[1]:+.3f}, {ade[2]:+.3f}] | {com[0]:+.1%} [{com[1]:+.1%}, {com[2]:+.1%}] |")
    return rows


def _family_verdicts(tests: dict, family: int, seeds_needed: int) -> dict:
    """claims.verdicts of the finished `tests` ({name: test}) Holm-adjusted over a family of
    `family` members, each one not finished yet counting as p = 1."""
    unfinished = [{"p": 1.0, "point": 0.0, "se": 0.0, "seeds": seeds_needed}] * (family - len(tests))
    return dict(zip(tests, claims.verdicts(list(tests.values()) + unfinished)))


def _pooled_tau(runs: list[dict]) -> float:
    """Tokens per target pass over every scene of every run (draft numbers with per_scene records)."""
    return sum(r["n"] for x in runs for r in x["per_scene"]) / sum(r["f"] for x in runs for r in x["per_scene"])


def aarl_grid_table(record: dict, seeds_needed: int = 3) -> list[str]:
    """An AARL grid (train.grid's summary.json): per setting, the finished seeds, greedy tau of the
    initial and the trained draft pooled over them, the paired change with the shared-scene
    interval (train.claims.hierarchical_diff: seeds and the shared scenes resampled), its p
    Holm-adjusted over every setting of the grid (a setting not finished counts as p = 1), the
    AARL reward before and after, the KL to the initial draft at the last step, and a verdict once
    `seeds_needed` seeds are in."""
    by = {}
    for c in record["cells"]:
        by.setdefault(c["setting"], []).append(c)
    tests = {}
    for setting, cs in by.items():
        a = {c["seed"]: c["scores"]["init"] for c in cs}
        b = {c["seed"]: c["scores"]["draft"] for c in cs}
        tests[setting] = claims.hierarchical_diff(a, b)
    done = [s for s in record["settings"] if s in by and len(by[s]) >= seeds_needed]
    judged = _family_verdicts({s: tests[s] for s in done}, len(record["settings"]), seeds_needed)
    sc = record["cells"][0]["scores"] if record["cells"] else {}
    rows = [f"| setting | seeds | tau k={sc.get('k', 8)} initial -> trained | change [95%] | p (Holm) | "
            "AARL reward initial -> trained | KL at the last step | wall per cell | verdict |",
            "|" + "---|" * 9]
    for setting in record["settings"]:
        cs = by.get(setting, [])
        if not cs:
            rows.append(f"| {setting} | none | - | - | - | - | - | - | not run yet |")
            continue
        t = tests[setting]
        tau = [_pooled_tau([c["scores"][k] for c in cs]) for k in ("init", "draft")]
        rw = [np.mean([c["scores"][k]["reward"]["reward"] for c in cs]) for k in ("init", "draft")]
        kl = np.mean([c["log"].get("kl", float("nan")) for c in cs])
        wall = np.mean([c.get("wall_s") or float("nan") for c in cs]) / 60
        if setting in judged:
            verdict, ptext = judged[setting]["verdict"], f"{judged[setting]['p_holm']:.3f}"
        else:
            verdict, ptext = f"{len(cs)} of {seeds_needed} seeds: no verdict yet", "-"
        rows.append(f"| {setting} | {', '.join(str(c['seed']) for c in cs)} | {tau[0]:.2f} -> {tau[1]:.2f} | "
                    f"{t['point']:+.2f} [{t['lo']:+.2f}, {t['hi']:+.2f}] | {ptext} | {rw[0]:.3f} -> {rw[1]:.3f} | "
                    f"{kl:.4f} | {wall:.1f} min | {verdict} |")
    return rows


def _setting_value(overrides: list[str], key: str) -> str | None:
    for o in overrides:
        k, _, v = o.partition("=")
        if k == key:
            return v.strip("[] ")
    return None


def dose_grid_table(record: dict, seeds_needed: int = 3) -> list[str]:
    """The FlatRoPE dose-response grid (train.grid's summary.json of configs/grids/flatrope-dose.yaml):
    per position gap G (the reasoning rows moved on by G image regions: 1 + G times today's vision
    tokens in position space), flat and mrope tau pooled over their seeds, and the gain flat - mrope
    with the shared-scene interval (train.claims.hierarchical_diff), Holm over the gaps once a gap
    has `seeds_needed` seeds of both. Then the dose-response itself: the gain at the largest gap
    minus the gain at gap 0 (a difference in differences; the four groups resampled together, seeds
    and the shared scenes), with its own verdict ("holds" = the gain grows with the gap)."""
    where = {s: (int(_setting_value(o, "position_gap") or 0), _setting_value(o, "drafts"))
             for s, o in record["setting_overrides"].items()}
    groups: dict = {}
    for c in record["cells"]:
        groups.setdefault(where[c["setting"]], {})[c["seed"]] = c["scores"]["draft"]
    gaps = sorted({g for g, _ in where.values()})
    full = {g for g in gaps if all(len(groups.get((g, v), {})) >= seeds_needed for v in ("flat", "mrope"))}
    tests = {g: claims.hierarchical_diff(groups[(g, "mrope")], groups[(g, "flat")]) for g in gaps if g in full}
    judged = _family_verdicts(tests, len(gaps), seeds_needed)
    k = record["cells"][0]["scores"].get("k", 8) if record["cells"] else 8

    def tau(runs: dict) -> str:
        return f"{_pooled_tau(list(runs.values())):.2f}" if runs else "-"
    rows = [f"| position gap | vision tokens in position space | flat tau k={k} | mrope tau k={k} | "
            "flat - mrope [95%] | seeds (flat, mrope) | p (Holm) | verdict |", "|" + "---|" * 8]
    for g in gaps:
        f, m = groups.get((g, "flat"), {}), groups.get((g, "mrope"), {})
        if g in judged:
            t = judged[g]
            diff, ptext, verdict = f"{t['point']:+.2f} [{t['lo']:+.2f}, {t['hi']:+.2f}]", f"{t['p_holm']:.3f}", t["verdict"]
        else:
            diff, ptext = "-", "-"
            verdict = f"{len(f)} and {len(m)} of {seeds_needed} seeds: no verdict yet" if f or m else "not run yet"
        rows.append(f"| {g} | {1 + g}x | {tau(f)} | {tau(m)} | {diff} | {len(f)}, {len(m)} | {ptext} | {verdict} |")
    lo, hi = gaps[0], gaps[-1]
    if lo in full and hi in full and lo != hi:
        t = claims.hierarchical_diff_in_diff(groups[(lo, "mrope")], groups[(lo, "flat")],
                                             groups[(hi, "mrope")], groups[(hi, "flat")])
        v = claims.verdicts([t])[0]
        words = {"holds": "holds: the gain grows with the gap",
                 "does not hold": "does not hold: the gain shrinks with the gap"}.get(v["verdict"], v["verdict"])
        rows += ["", f"Dose-response (the gain at gap {hi} minus the gain at gap {lo}, {t['seeds']} seeds x "
                     f"{t['scenes']} shared scenes): {t['point']:+.2f} [{t['lo']:+.2f}, {t['hi']:+.2f}], "
                     f"p = {t['p']:.3f}: {words}."]
    else:
        rows += ["", f"Dose-response (the gain at gap {hi} minus the gain at gap {lo}): no verdict until both "
                     f"gaps have {seeds_needed} seeds of flat and of mrope."]
    return rows


def attention_png(splits: dict, png, split: str = "test") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = grouped(splits[split]["drafts"])
    names = list(g)
    vals = np.array([np.mean([[np.mean(n["attn_layers"][k]) for k in KINDS] for n in seeds.values()], 0)
                     for seeds in g.values()])                         # (drafts, 3)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names)), 3.2))
    x = np.arange(len(names))
    for i, kind in enumerate(KINDS):
        ax.bar(x + (i - 1) * 0.27, vals[:, i], 0.27, label=f"{kind} keys")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("attention mass")
    ax.set_title(f"draft attention at the reasoning rows by key type ({split})", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def alpha_position_png(splits: dict, png, split: str = "test", max_pos: int = 60) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for g, seeds in grouped(splits[split]["drafts"]).items():
        hits = [r["hits"] for n in seeds.values() for r in n["per_scene"]]
        pos = np.arange(min(max_pos, max(len(h) for h in hits)))
        alpha = [np.mean([h[i] for h in hits if len(h) > i]) for i in pos]
        ax.plot(pos, alpha, label=g, lw=1.2)
    ax.set_xlabel("token position within the CoC")
    ax.set_ylabel("alpha (draft's next token = target's)")
    ax.set_title(f"per-token acceptance by position ({split})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def marked(name: str, table: list[str], stamp: dict | None, source: str, by: str = "specdrive report") -> list[str]:
    """A table between the results markers `specdrive report` re-renders (core/stamp.py), with
    the metrics' stamp: its checkpoint fingerprint is what tests/test_results_stamps.py checks."""
    from core.stamp import stamp_line

    stamp = stamp or {}
    return [f"<!-- results claims-{name} fingerprint={stamp.get('fingerprint') or 'unknown'} -->",
            stamp_line(stamp, source, by=by), "", *table, f"<!-- /results claims-{name} -->"]


def sections(splits: dict, img_dir, rel, stamp: dict | None = None, source: str = "metrics.json",
             by: str = "specdrive report", skip_empty: bool = False) -> list[str]:
    """The markdown sections (pictures written into img_dir, linked as rel/NAME), each table
    between results markers carrying `stamp`'s fingerprint; `by` the command that writes them (a
    model card: `specdrive train eval`), skip_empty: leave out a section whose table has no rows
    (a card of a planner with one seed and no AARL run)."""
    if skip_empty:
        kept = sections(splits, img_dir, rel, stamp, source, by)
        return _without_empty(kept)

    def block(name: str, table: list[str]) -> list[str]:
        return marked(name, table, stamp, source, by)
    img_dir = Path(img_dir)
    img_dir.mkdir(parents=True, exist_ok=True)
    attention_png(splits, img_dir / "claims_attention.png")
    alpha_position_png(splits, img_dir / "claims_alpha_position.png")
    rel = Path(rel)
    return ["## Verdicts, with seed-level intervals", "",
            "Intervals: 95 %, from a bootstrap that resamples the training seeds and the scenes, each scene "
            "once (every seed is scored on the same scenes: the seeds x scenes column says so), as the point "
            "-/+ t x its standard error, t with seeds - 1 degrees of freedom. Holm adjusts the p values (the "
            "same t) within each family: the tau comparisons, the attention comparisons. A verdict of holds "
            "or does not hold needs an adjusted p below 0.05; otherwise the row says what it could have "
            "detected (80 % power at the family's strictest level, the same t).", "",
            *block("verdicts", verdict_table(splits)), "",
            "## Acceptance, per draft group over its seeds", "",
            "Intervals: 95% bootstrap over scenes of the seed-pooled ratio; per-seed tau in its own column. "
            "Draft share of CoC = accepted draft tokens / CoC tokens (1 - 1/tau); tokens per accepted block = "
            "accepted draft tokens per target pass.", "", *block("acceptance", acceptance_table(splits)), "",
            "## Paired differences (same scenes, same seeds)", "",
            "The seed-level interval resamples the training seeds and the shared scenes, each scene once "
            "(train.claims.hierarchical_diff), so it carries the spread from one seed to the next. p (Holm): the "
            "two-sided p of no difference against a t with seeds - 1 degrees of freedom, Holm-adjusted over "
            "every row of this table. Detectable: the "
            "difference this row had 80 % power to find at the family's strictest level. Verdict: holds or does "
            "not hold only where the adjusted p is below 0.05; otherwise not resolved at this power. The "
            "scene-level interval pools the seeds and leaves their spread out; the last column gives each seed's "
            "own difference.", "",
            *block("comparison", comparison_table(splits)), "",
            "## Attention mass by key type at the reasoning rows (test, mean over seeds)", "",
            f"![attention mass]({rel / 'claims_attention.png'})", "", *block("attention", attention_table(splits)), "",
            "## Per-token acceptance by position within the CoC (test)", "",
            f"![alpha by position]({rel / 'claims_alpha_position.png'})", "",
            "## Action quality under a budget of target passes", "",
            "The budget lets P target passes write the CoC (plain decoding: P tokens; a draft: what its exact "
            "greedy loop at k = 8 emits in P passes), then closes it with <|cot_end|>; the expert then plans "
            "(mean of 8 draws). The text is still the target's, only shorter when the draft is worse.", "",
            *block("budget", budget_table(splits)), "",
            "## AARL runs against their starting draft", "", *block("aarl", aarl_table(splits)), ""]


def _without_empty(lines: list[str]) -> list[str]:
    """`lines` (sections: "## " headings, results blocks) less every section whose results block
    holds a table with no rows."""
    out, section = [], []

    def flush():
        rows = [x for x in section if x.startswith("|")]
        if not any(x.startswith("<!-- results ") for x in section) or len(rows) > 2:
            out.extend(section)
    for line in lines:
        if line.startswith("## "):
            flush()
            section = []
        section.append(line)
    flush()
    return out


def write(metrics_json, out_md, img_dir, rel="img") -> str:
    m = json.loads(Path(metrics_json).read_text())
    lines = [f"<!-- written by train.claims_report from {metrics_json}; do not edit by hand -->", "",
             *sections(m["splits"], img_dir, rel, m.get("stamp"), str(metrics_json))]
    Path(out_md).write_text("\n".join(lines))
    return str(out_md)
