"""`specdrive roofline`: will a preset's cycle fit its budget on a device? (bench/roofline/projection.py) (the library of tools/roofline.py)

Prints per-stage projected ms for plain and speculative decoding, whether the cycle fits the
budget (and whether the budget's premise, vision + prefill + trajectory + margin, holds), and
the remedies that would make it fit. `--device cpu` measures this CPU's peaks first
(bench/roofline/microbench.py); `--validate` compares the projection with a `specdrive profile` run's
measured calls (ratio per stage). `--memory` adds the memory report. `--trees` prices token
trees against the chain (k, tau): the verify of each width, each tree's draft and step, and
with a tree's tau (`--tree-tau`, or measured: a `specdrive bench` record, `--bench`) the reasoning
stage against the chain's; the best tree is reported against TREE_GOAL (issue 36).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from core.config import ConfigError, read_json
from bench.common.devices import load_devices
from bench.common.costs import Device, Workload
from bench.roofline.projection import drive_cycle, memory_report, project, project_trees, remedies, stage_costs
from runtime.config import tree_shape

SMALLER = {"alpamayo-r1-10b": "edge-2b"}     # the remedy "a smaller preset"
TREE_GOAL = 0.15                # issue 36: the reasoning stage with the best tree >= 15 % below the chain's


@dataclass(frozen=True)
class RooflineRun:
    """One `specdrive roofline` question: a preset on a device, the workload's overrides (None: the
    profile's, the devices file's or the preset's), what to add and where to write it."""
    preset: str = "alpamayo-r1-10b"
    device: str = "orin-agx-64"     # a configs/devices.yaml name, or cpu (measured here)
    precision: str | None = None    # None: int8 on devices, fp32 on cpu
    profile: str | None = None      # None: default_profile(device)
    budget_ms: float | None = None
    k: int | None = None
    tau: float = 3.0
    reasoning_tokens: int | None = None
    samples: int | None = None
    euler_steps: int | None = None
    draft_vocab: int = 0            # draft LM head rows (0: the target's head)
    encoded_images: int | None = None
    lookup_share: float = 0.5       # the drives row: share of speculative steps proposed by lookup
    threads: int = 1                # torch threads of the cpu microbenchmark
    memory: bool = False
    validate: Path | None = None    # a `specdrive profile` stats.json
    json: Path | None = None
    trees: tuple = ()               # token trees "N,d,K" priced against the chain (k, tau)
    tree_tau: tuple = ()            # each tree's tau, in order (else from `bench`, else its cost only)
    bench: Path | None = None       # a `specdrive bench` record: its tree modes' tau, its k chain's tau
    measured: Path | None = None    # a measured floor (tools.measure_c --floor): predicted against measured


def with_draft_vocab(cfg, n: int):
    """The preset with a reduced draft head of n rows (0: the target's head)."""
    if not n:
        return cfg
    return dataclasses.replace(cfg, draft=dataclasses.replace(cfg.draft, vocab=n))


def default_profile(device: str) -> str:
    return "thor" if "thor" in device else "cpu" if device == "cpu" else "orin"


def workload(q: RooflineRun, model_cfg, planner_cfg, overrides: dict) -> Workload:
    """The profile's cycle, the devices file's camera setup for the preset, the arguments."""
    p = planner_cfg
    base = {"images": len(p.cameras) * p.frames, "image_hw": tuple(p.image_hw), "max_len": p.max_len,
            "k": p.spec.k, "samples": p.trajectory_samples,
            "euler_steps": p.euler_steps or model_cfg.expert.euler_steps,
            "budget_ms": p.budget.budget_ms, "margin_ms": p.budget.margin_ms}
    base.update(overrides)
    given = {"precision": q.precision, "budget_ms": q.budget_ms, "k": q.k, "tau": q.tau,
             "reasoning_tokens": q.reasoning_tokens, "samples": q.samples,
             "euler_steps": q.euler_steps, "encoded_images": q.encoded_images}
    base.update({k: v for k, v in given.items() if v is not None})
    base.setdefault("precision", "fp32" if q.device == "cpu" else "int8")
    if base["k"] and base["tau"] > base["k"] + 1:
        raise ConfigError(f"--tau {base['tau']} exceeds k + 1 = {base['k'] + 1}")
    return Workload(**base)


def resolve_device(q: RooflineRun) -> tuple[Device, dict | None]:
    if q.device == "cpu":
        from bench.roofline.microbench import cpu_device, measure_cpu

        peaks = measure_cpu(q.threads)
        return cpu_device(peaks), peaks
    table = load_devices().devices
    if q.device not in table:
        raise ConfigError(f"--device {q.device!r} is not known; devices: {sorted(table) + ['cpu']}")
    return table[q.device], None


def run(q: RooflineRun) -> int:
    from models.config import load_preset
    from runtime.config import load_planner_config

    cfg = with_draft_vocab(load_preset(q.preset), q.draft_vocab)
    dev, peaks = resolve_device(q)
    floor = None
    if q.measured:
        from bench.roofline.measured import DTYPE_PRECISION, read_floor

        floor = read_floor(q.measured, q.preset)
        if q.precision is None:
            q = dataclasses.replace(q, precision=DTYPE_PRECISION.get(floor["dtype"], floor["dtype"]))
    pcfg = load_planner_config(q.profile or default_profile(q.device))
    w = workload(q, cfg, pcfg, dict(load_devices().workloads.get(q.preset, {})))
    smaller = (SMALLER[q.preset], load_preset(SMALLER[q.preset])) if q.preset in SMALLER else None
    trees, chain_tau = tree_taus(q, w.k)
    if chain_tau is not None:
        w = dataclasses.replace(w, tau=chain_tau)
    result = roofline(cfg, dev, w, len(pcfg.cameras), smaller, q.lookup_share)
    result.update(preset=q.preset, device=q.device, peaks=peaks)
    print(format_result(result))
    prices = None
    if floor is not None:
        result["measured"], prices = measured_report(q, cfg, dev, w, floor)
    if trees:
        result["token_trees"] = {**project_trees(cfg, dev, w, trees, TREE_GOAL, prices),
                                 "tau_from": {"trees": "--tree-tau" if q.tree_tau else str(q.bench or "-"),
                                              "chain": "--tau" if chain_tau is None else str(q.bench)},
                                 "priced_from": str(q.measured) if prices else "the roofline"}
        print(format_trees(result["token_trees"]))
    if q.memory:
        result["memory"] = memory_report(cfg, w.precision, [result["prompt_len"]], w.max_len,
                                         list(range(1, pcfg.spec.k_max + 2)), w.samples)
        print(format_memory(result["memory"]))
    if q.validate:
        result["validation"] = validate(cfg, dev, w, read_stats(q.validate))
        print(format_validation(result["validation"]))
    if q.json:
        from core.stamp import SHIPPED, results_stamp

        # a projection of the preset: it reads no checkpoint (--bench/--validate records carry their own)
        result["stamp"] = results_stamp(SHIPPED, reads_checkpoint=False)
        q.json.parent.mkdir(parents=True, exist_ok=True)
        q.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


OTHERS = ("orin-agx-64", "thor")      # projected with the measured efficiencies (--measured)


def measured_report(q: RooflineRun, cfg, dev: Device, w: Workload, floor: dict) -> tuple[dict, dict]:
    """--measured: every call kind predicted against measured on `dev`, the efficiencies the floor
    reached, the Orin / Thor cycles with them (INT8, their datasheet peaks; bench/roofline/measured.py)
    -> (the report, the prices --trees takes from the floor)."""
    from bench.roofline.measured import calibrated, check_finite, compare, efficiencies, format_compare, measured_prices

    rows = compare(cfg, dev, floor, w.precision)
    check_finite(rows)
    eff = efficiencies(dev, floor, w.precision)
    table, others = load_devices().devices, []
    for name in OTHERS:
        ow = dataclasses.replace(w, precision="int8")
        others.append({"device": name, "precision": "int8",
                       "assumed_eff_ms": project(cfg, table[name], ow)["speculative"]["cycle_ms"],
                       "measured_eff_ms": project(cfg, calibrated(table[name], eff), ow)["speculative"]["cycle_ms"],
                       "efficiencies": {k: eff[k] for k in ("memory_efficiency", "compute_efficiency")}})
    print(format_compare(rows, floor, dev, eff, others))
    report = {"file": str(q.measured), "calls": rows, "efficiencies": eff, "projections": others,
              "floor": {k: floor.get(k) for k in ("device", "device_name", "dtype", "path", "graphs", "max_len",
                                                   "cached", "copy_gbps", "kernels")}}
    return report, measured_prices(floor, w.k)


def roofline(cfg, dev: Device, w: Workload, cameras: int, smaller: tuple | None = None,
             lookup_share: float = 0.5) -> dict:
    res = project(cfg, dev, w)
    res["drive"] = {**drive_cycle(cfg, dev, w, cameras, lookup_share), "new_images": min(cameras, w.images),
                    "lookup_share": lookup_share}
    res["drive_streaming"] = {**drive_cycle(cfg, dev, w, cameras, lookup_share, streaming=True),
                              "new_images": min(cameras, w.images), "lookup_share": lookup_share}
    res["workload"] = dataclasses.asdict(w)
    res["device_title"] = dev.title
    res["assumptions"] = {"compute_efficiency": dev.compute_efficiency,
                          "memory_efficiency": dev.memory_efficiency, "impl": dev.impl}
    res["remedies"], res["with_remedies"] = [], None
    if not res["speculative"]["fits"]:
        res["remedies"], best = remedies(cfg, dev, w, cameras, smaller)
        res["with_remedies"] = {**project(cfg, dev, best), "workload": dataclasses.asdict(best)}
    return res


def tree_taus(q: RooflineRun, k: int) -> tuple[list, float | None]:
    """-> ([(TreeShape, tau or None)], the chain's tau or None: --tau). A tree's tau is its
    --tree-tau, else, with --bench, the tau of the record's fixed-tree mode of that shape (the
    trees default to those it ran), whose draft's k={k} chain then gives the chain's tau."""
    if q.tree_tau and len(q.tree_tau) != len(q.trees):
        raise ConfigError(f"--tree-tau gives {len(q.tree_tau)} values for {len(q.trees)} --trees; give one per tree")
    measured, chain = {}, None
    if q.bench:
        rec = read_json(q.bench, "--bench record")
        modes = rec.get("modes") if isinstance(rec, dict) else None
        if not isinstance(modes, list) or not all(isinstance(m, dict) and "tau" in m for m in modes):
            raise ConfigError(f"--bench {str(q.bench)!r}: not a `specdrive bench` record (needs 'modes' with 'tau')")
        fixed = [m for m in modes if m.get("tree") and m.get("k") != "adaptive"]
        if not fixed:
            raise ConfigError(f"--bench {str(q.bench)!r} ran no tree mode; run `specdrive bench --trees N,d,K`")
        draft = fixed[0]["draft"]
        measured = {m["tree"]: m["tau"] for m in fixed if m["draft"] == draft}
        chain = next((m["tau"] for m in modes if m.get("draft") == draft and m.get("k") == k and not m.get("tree")),
                     None)
    names = q.trees or tuple(measured)
    taus = q.tree_tau or tuple(measured.get(str(tree_shape(t))) for t in names)
    return [(tree_shape(t, "--trees"), tau) for t, tau in zip(names, taus)], chain


def read_stats(path) -> dict:
    """A `specdrive profile` stats.json: calls, prompt_len and reasoning_tokens (ConfigError)."""
    stats = read_json(path, "--validate profile stats")
    ok = isinstance(stats, dict) and isinstance(stats.get("calls"), dict) and all(
        isinstance(stats.get(k), (int, float)) and not isinstance(stats.get(k), bool) and math.isfinite(stats[k])
        for k in ("prompt_len", "reasoning_tokens"))
    if not ok:
        raise ConfigError(f"--validate {str(path)!r}: not the stats.json of `specdrive profile` (needs 'calls', "
                          "a finite 'prompt_len' and 'reasoning_tokens')")
    return stats


def validate(cfg, dev: Device, w: Workload, stats: dict) -> list[dict]:
    """measured / projected per engine call, the workload set to what the run processed."""
    calls = stats["calls"]
    w = dataclasses.replace(w, prompt_len=int(stats["prompt_len"]),
                            reasoning_tokens=int(round(stats["reasoning_tokens"])))
    costs = stage_costs(cfg, w, dev.impl)
    rows = []

    def row(name, measured, projected):
        if measured:
            rows.append({"stage": name, "measured_ms": measured, "projected_ms": projected,
                         "ratio": measured / projected if projected else None})
    row("vision", calls.get("vision"), costs["vision"].ms(dev, w.precision))
    row("prefill", calls.get("prefill"), costs["prefill"].ms(dev, w.precision))
    row("draft per proposal (call / k)", calls.get("draft_step"), costs["draft_step"].ms(dev, w.precision))
    for width, ms in sorted((int(k), v) for k, v in calls.get("verify", {}).items()):
        pw = dataclasses.replace(w, k=width - 1, tau=1.0)
        row(f"verify width {width}", ms, stage_costs(cfg, pw, dev.impl)["verify"][width].ms(dev, w.precision))
    row("trajectory (rewrite + expert)", calls.get("action"), costs["trajectory"].ms(dev, w.precision))
    return rows


def format_result(r: dict) -> str:
    w, st = r["workload"], r["stages_ms"]
    k = w["k"]
    lines = [f"{r['preset']} on {r['device_title']} ({w['precision']}, {r['assumptions']['impl']}; "
             f"compute x{r['assumptions']['compute_efficiency']}, bandwidth x{r['assumptions']['memory_efficiency']}): "
             f"prompt {r['prompt_len']} tokens, {w['reasoning_tokens']} reasoning tokens, k={k}, tau={w['tau']}, "
             f"{w['samples']} draws x {w['euler_steps']} Euler steps, budget {w['budget_ms']:g} ms",
             "| stage | plain ms | speculative ms |", "|---|---|---|"]
    for name in ("vision", "prefill"):
        lines.append(f"| {name} | {st[name]:.1f} | {st[name]:.1f} |")
    lines.append(f"| draft per proposal / verify 1 / verify {k + 1} | - / {st['verify_1']:.2f} / - | "
                 f"{st['draft_step']:.2f} / - / {st[f'verify_{k + 1}']:.2f} |")
    lines.append(f"| reasoning | {r['plain']['reasoning_ms']:.1f} | {r['speculative']['reasoning_ms']:.1f} |")
    lines.append(f"| trajectory | {st['trajectory']:.1f} | {st['trajectory']:.1f} |")
    fit = {m: "fits" if r[m]["fits"] else "does not fit" for m in ("plain", "speculative")}
    lines.append(f"| **cycle** | **{r['plain']['cycle_ms']:.1f}** ({fit['plain']}) | "
                 f"**{r['speculative']['cycle_ms']:.1f}** ({fit['speculative']}) |")
    lines.append(f"premise (vision + prefill + trajectory + margin <= budget): "
                 f"{'holds' if r['premise_ok'] else 'broken'}; reasoning tokens within the budget: "
                 f"plain {r['tokens_in_budget']['plain']}, speculative {r['tokens_in_budget']['speculative']}")
    d = r.get("drive")
    if d:
        lines.append(f"drive (reuse): vision on {d['new_images']} new frames {d['stages_ms']['vision']:.1f} ms, "
                     f"{d['lookup_share']:.0%} of the steps proposed by lookup (no draft step; assumed, "
                     f"`specdrive bench --drives` measures it): speculative cycle "
                     f"{d['speculative']['cycle_ms']:.1f} ms "
                     f"against {r['speculative']['cycle_ms']:.1f} ms on snapshots "
                     f"({'fits' if d['speculative']['fits'] else 'does not fit'})")
    ds = r.get("drive_streaming")
    if ds:
        lines.append(f"drive + streaming prefill (a frame_local target: the {ds['new_images']} new frames' image "
                     f"blocks only, the kept ones rotated): prefill {ds['stages_ms']['prefill']:.1f} ms against "
                     f"{d['stages_ms']['prefill']:.1f}, speculative cycle {ds['speculative']['cycle_ms']:.1f} ms "
                     f"({d['speculative']['cycle_ms'] - ds['speculative']['cycle_ms']:.1f} ms below the drive "
                     f"cycle; {'fits' if ds['speculative']['fits'] else 'does not fit'})")
    for m in r.get("remedies", []):
        line = f"  remedy: {m['remedy']}: alone {m['alone_ms']:.0f} ms ({'fits' if m['alone_fits'] else 'no'})"
        if "cumulative_ms" in m:
            line += (f"; {'kept' if m['kept'] else 'not kept (no gain)'}, with those kept "
                     f"{m['cumulative_ms']:.0f} ms ({'fits' if m['cumulative_fits'] else 'no'})")
        lines.append(line)
    b = r.get("with_remedies")
    if b:
        lines.append(f"with the kept remedies: vision {b['stages_ms']['vision']:.1f}, prefill "
                     f"{b['stages_ms']['prefill']:.1f}, trajectory {b['stages_ms']['trajectory']:.1f} ms; "
                     f"speculative cycle {b['speculative']['cycle_ms']:.1f} ms; premise "
                     f"{'holds' if b['premise_ok'] else 'broken'}; reasoning tokens within the budget: "
                     f"plain {b['tokens_in_budget']['plain']}, speculative {b['tokens_in_budget']['speculative']}")
    return "\n".join(lines)


def format_trees(t: dict) -> str:
    c = t["chain"]
    lines = ["token trees (EAGLE-2 drafting: d calls, K candidates a call after the root; one verify "
             f"of width 1 + nodes; the accepted rows moved); the trees' tau from {t['tau_from']['trees']}, the "
             f"chain's from {t['tau_from']['chain']}",
             "verify ms by width: " + ", ".join(f"{w} {ms:.2f}" for w, ms in t["verify_ms"].items()),
             f"| tree | width | draft ms | verify ms | step ms | tau | reasoning ms | below the chain k={c['k']} "
             f"(tau {c['tau']:.2f}, {c['reasoning_ms']:.1f} ms) | tau for {t['goal']:.0%} below |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in t["trees"]:
        tau, reason, below = (("-", "-", "-") if r["tau"] is None else
                              (f"{r['tau']:.2f}", f"{r['reasoning_ms']:.1f}", f"{r['below_chain']:.1%}"))
        need = "-" if r["tau_needed"] is None else f"{r['tau_needed']:.2f}"
        lines.append(f"| {r['tree']} | {r['width']} | {r['draft_ms']:.2f} | {r['verify_ms']:.2f} | {r['step_ms']:.2f} "
                     f"| {tau} | {reason} | {below} | {need} |")
    if t["best"]:
        best = next(r for r in t["trees"] if r["tree"] == t["best"])
        lines.append(f"best tree {best['tree']}: reasoning {best['reasoning_ms']:.1f} ms, {best['below_chain']:.1%} "
                     f"below the chain's {c['reasoning_ms']:.1f} ms (goal >= {t['goal']:.0%}: "
                     f"{'met' if t['met'] else 'NOT met'})")
    return "\n".join(lines)


def format_memory(m: dict) -> str:
    gb = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**28 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    lines = [f"memory ({m['precision']}): weights " + ", ".join(f"{k} {gb(v)}" for k, v in m["weights"].items()),
             "K/V cache (target + draft): " + ", ".join(f"{L} rows {gb(v['target'] + v['draft'])}"
                                                       for L, v in m["kv_cache"].items()),
             "activations per verify width: " + ", ".join(f"w{w} {gb(v)}" for w, v in m["activations"].items())
             + f"; all widths as CUDA-graph pools {gb(m['graph_pools'])}",
             "prefill activations: " + ", ".join(f"{L} tokens {gb(v)}" for L, v in m["prefill_activations"].items())
             + f"; expert draws {gb(m['expert_activations'])}"]
    return "\n".join(lines)


def format_validation(rows: list[dict]) -> str:
    lines = ["| stage | measured ms | projected ms | measured / projected |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['measured_ms']:.2f} | {r['projected_ms']:.3f} | {r['ratio']:.1f} |")
    return "\n".join(lines)
