"""The numbers behind docs/claims.md: intervals over scenes, and action quality under a budget.

    intervals(per_scene)        95% bootstrap intervals (over scenes) of tau, alpha on routine and
                                commitment tokens, and the free-running accepted length
    paired(a, b)                the mean of b - a over the same scenes, with its 95% interval
    budget_action(...)          ADE and commitment correctness of the text a budget of P target
                                passes lets through, per draft (the setting where the draft changes
                                what the planner does: a better draft fits more reasoning)

A bootstrap resamples scenes (with replacement) and recomputes each ratio from the resampled
scenes' sums, so a scene with a long CoC weighs as it does in the point estimate.
"""
from __future__ import annotations

import numpy as np
import torch

from train import data, metrics

BOOT = 2000          # bootstrap resamples
LEVEL = 0.95


def ratio(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return num[idx].sum(1) / np.maximum(den[idx].sum(1), 1)


def intervals(per_scene: list[dict], seed: int = 0) -> dict:
    """{metric: [point, lo, hi]} for tau (at the evaluated k), alpha_routine, alpha_commitment and
    free_running, from per-scene records (train.evaluate.draft_numbers)."""
    if not per_scene:
        return {}
    pairs = {"tau": ([r["n"] for r in per_scene], [r["f"] for r in per_scene]),
             "alpha_routine": ([r["routine"][0] for r in per_scene], [r["routine"][1] for r in per_scene]),
             "alpha_commitment": ([r["commitment"][0] for r in per_scene], [r["commitment"][1] for r in per_scene]),
             "free_running": ([r["free"][0] for r in per_scene], [r["free"][1] for r in per_scene])}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_scene), size=(BOOT, len(per_scene)))
    out = {}
    for name, (num, den) in pairs.items():
        num, den = np.asarray(num, float), np.asarray(den, float)
        boot = ratio(num, den, idx)
        lo, hi = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        out[name] = [float(num.sum() / max(den.sum(), 1)), float(lo), float(hi)]
    return out


def paired(a, b, seed: int = 0) -> list[float]:
    """[mean(b - a), lo, hi]: the per-scene difference of two measures on the same scenes."""
    d = np.asarray(b, float) - np.asarray(a, float)
    if d.size == 0:
        return [float("nan")] * 3
    idx = np.random.default_rng(seed).integers(0, d.size, size=(BOOT, d.size))
    lo, hi = np.quantile(d[idx].mean(1), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(d.mean()), float(lo), float(hi)]


def mean_interval(values, seed: int = 0) -> list[float]:
    """[mean, lo, hi] of per-scene values."""
    return paired(np.zeros(len(values)), values, seed)


@torch.no_grad()
def budget_action(expert, target, teachers, examples, scenes, tok, drafts: dict, passes: tuple,
                  samples: int = 1) -> dict:
    """Per budget of P target passes: the CoC rows written within it (draft d: its replayed
    greedy loop's `cut` from train.evaluate.draft_numbers; plain decoding: P tokens), then
    <|cot_end|> as the budget closes the text, then the expert. Returns per mode ("plain", "full"
    = no budget, each draft) and P: mean ADE, commitment correctness of the text let through, and
    CoC tokens written, with per-scene ADE and commitment lists for paired comparisons."""
    modes = {"plain": [list(passes)] * len(teachers)} | \
            {name: [r["cut"] for r in d["per_scene"]] for name, d in drafts.items()}
    rows = {name: {p: {"ade": [], "commitment": [], "tokens": []} for p in passes} for name in modes}
    rows["full"] = {0: {"ade": [], "commitment": [], "tokens": []}}
    for i, (t, e) in enumerate(zip(teachers, examples)):
        coc = t.cot_end - t.first                 # CoC tokens after the pending first one
        wanted = {n: None for n in [coc] + [min(c, coc) for cuts in modes.values() for c in cuts[i]]}
        dev = target.embed_tokens.weight.device
        ids = torch.from_numpy(t.ids)[None].to(dev)
        cache = target.new_cache(1, len(t.ids))
        target(ids, *target.rope(torch.from_numpy(t.positions)[:, None]), cache, 0, *data.vision_embeds(target, e))
        for n in sorted(wanted, reverse=True):    # longest first: a cut overwrites only its own row
            last = t.first + n                    # rows first .. last hold the CoC written so far
            if n < coc:
                pos = torch.full((1, 1), last + 1 + e.rope_delta)
                target(torch.tensor([[tok.cot_end]], device=dev), *target.rope(pos), cache, last + 1)
                rows_read = last + 2
            else:
                rows_read = t.cot_end + 1
            wp, _ = expert.sample(cache, rows_read, torch.tensor([e.v0], device=dev), rope_delta=e.rope_delta,
                                  noise=data.expert_noise(expert, e.index, samples, dev), samples=samples)
            text = [x for x in t.ids[t.first:min(last, t.cot_end - 1) + 1].tolist() if x != tok.cot_end]
            cause, decision = metrics.commitment_correct(tok.decode(text).split(), scenes[e.index])
            wanted[n] = (metrics.ade(wp[0].cpu().numpy(), e.future), float(cause and decision))
        for name, cuts in modes.items():
            for p, c in zip(passes, cuts[i]):
                ade, right = wanted[min(c, coc)]
                rows[name][p]["ade"].append(ade)
                rows[name][p]["commitment"].append(right)
                rows[name][p]["tokens"].append(min(c, coc))
        rows["full"][0]["ade"].append(wanted[coc][0])
        rows["full"][0]["commitment"].append(wanted[coc][1])
        rows["full"][0]["tokens"].append(coc)
    return {"passes": list(passes), "modes": {
        name: {str(p): {"ade": float(np.mean(v["ade"])), "commitment": float(np.mean(v["commitment"])),
                        "tokens": float(np.mean(v["tokens"])), "ade_scenes": v["ade"], "tokens_scenes": v["tokens"],
                        "commitment_scenes": v["commitment"]} for p, v in per.items()}
        for name, per in rows.items()}}


# --- seed-level intervals: seeds and scenes, each scene counted once ------------------------------
#
# One evaluation scores every seed's draft on the same scenes (train.evaluate: one teacher list),
# so record i of every seed is scene i. A scene is then one piece of evidence however many seeds
# saw it: the bootstrap draws the seeds, and the scenes once for all of them (SHARED). Seeds scored
# on scenes of their own would draw the scenes within each seed (NESTED). Every group of a
# comparison shares the draws (seed labels and scenes paired). With a handful of seeds the
# interval, p and detectable effect take the bootstrap's standard error against a t with
# seeds - 1 degrees of freedom, not the normal.
POWER = 0.80
SHARED = "seeds and shared scenes resampled, each scene once"
NESTED = "seeds, then scenes within each seed"


def t_cdf(x: float, df: float) -> float:
    """Student's t distribution function (df = inf: the normal): with x = sqrt(df) tan(u) the
    density is c cos(u)^(df - 1) on [0, pi/2), integrated by Simpson's rule (df >= 1)."""
    import math
    if math.isinf(df):
        from statistics import NormalDist
        return NormalDist().cdf(x)
    u = np.linspace(0.0, math.atan(abs(x) / math.sqrt(df)), 2001)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    dens = c * np.cos(u) ** (df - 1)
    h = u[1] - u[0]
    half = h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    return 0.5 + math.copysign(float(half), x)


def t_ppf(q: float, df: float) -> float:
    """The q quantile of Student's t with df degrees of freedom (bisection on t_cdf)."""
    if not 0 < q < 1:
        raise ValueError(f"quantile {q}: must be in (0, 1)")
    lo, hi = -1e4, 1e4
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def tau_arrays(runs: dict, seeds: list) -> tuple[np.ndarray, np.ndarray]:
    """(n, f) arrays (seeds, scenes) of per-scene records {seed: draft numbers}: tokens and target
    passes; every seed on the same scenes."""
    n = np.array([[r["n"] for r in runs[s]["per_scene"]] for s in seeds], float)
    f = np.array([[r["f"] for r in runs[s]["per_scene"]] for s in seeds], float)
    return n, f


def two_level(num: np.ndarray, den: np.ndarray, seed: int = 0, boot: int = BOOT, shared: bool = True) -> np.ndarray:
    """Bootstrap replicates of sum(num) / sum(den) for arrays (groups, seeds, scenes): resample the
    seeds (with replacement) and the scenes; shared: one draw of the scenes per replicate for every
    seed (SHARED), else a draw per drawn seed (NESTED). Every group shares the draws. -> (boot, groups)."""
    rng = np.random.default_rng(seed)
    _, m, j = num.shape
    s_idx = rng.integers(0, m, size=(boot, m))[:, :, None]
    j_idx = rng.integers(0, j, size=(boot, 1, j) if shared else (boot, m, j))
    return np.stack([num[g][s_idx, j_idx].sum((1, 2)) / np.maximum(den[g][s_idx, j_idx].sum((1, 2)), 1e-12)
                     for g in range(num.shape[0])], 1)


def _summary(point: float, reps: np.ndarray, seeds: int, null: float = 0.0) -> dict:
    """point, its 95 % interval point -/+ t x se, se (the replicates' spread), the two-sided p of
    `null` against a t with seeds - 1 degrees of freedom, and df."""
    se, df = float(reps.std()), max(seeds - 1, 1)
    half = t_ppf((1 + LEVEL) / 2, df) * se
    p = 2 * (1 - t_cdf(abs(point - null) / se, df)) if se > 0 else float(point == null)
    return {"point": float(point), "lo": float(point - half), "hi": float(point + half), "se": se,
            "p": float(min(max(p, 0.0), 1.0)), "df": df, "design": SHARED}


def _common(a: dict, b: dict) -> list:
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed is in both groups; a paired seed-level comparison needs one")
    return seeds


def hierarchical_diff(a: dict, b: dict, seed: int = 0, boot: int = BOOT) -> dict:
    """tau(b) - tau(a) ({seed: draft numbers with per_scene records, every seed on the same
    scenes}) with the shared-scene bootstrap (two_level), so the interval carries the spread from
    one training seed to the next and each scene once. Returns point, lo, hi (95 %), se, the
    two-sided p of no difference (t, seeds - 1 df), and the seeds and scenes it used."""
    seeds = _common(a, b)
    na, fa = tau_arrays(a, seeds)
    nb, fb = tau_arrays(b, seeds)
    if na.shape != nb.shape:
        raise ValueError(f"the groups were evaluated on other scenes ({na.shape[1]} against {nb.shape[1]})")
    reps = two_level(np.stack([na, nb]), np.stack([fa, fb]), seed, boot)
    point = nb.sum() / fb.sum() - na.sum() / fa.sum()
    return _summary(point, reps[:, 1] - reps[:, 0], len(seeds)) | {"seeds": len(seeds), "scenes": na.shape[1]}


def hierarchical_diff_in_diff(a0: dict, b0: dict, a1: dict, b1: dict, seed: int = 0, boot: int = BOOT) -> dict:
    """(tau(b1) - tau(a1)) - (tau(b0) - tau(a0)): whether b's gain over a changes from one condition
    (0) to another (1), the four groups on the same scenes and resampled together (seeds common to
    all four, and the shared scenes), as hierarchical_diff."""
    seeds = sorted(set(a0) & set(b0) & set(a1) & set(b1))
    if not seeds:
        raise ValueError("no seed is in all four groups")
    arrays = [tau_arrays(g, seeds) for g in (a0, b0, a1, b1)]
    if len({n.shape for n, _ in arrays}) != 1:
        raise ValueError("the groups were evaluated on other scenes")
    n, f = np.stack([x for x, _ in arrays]), np.stack([y for _, y in arrays])
    reps = two_level(n, f, seed, boot)
    t = [x.sum() / y.sum() for x, y in arrays]
    return _summary((t[3] - t[2]) - (t[1] - t[0]), (reps[:, 3] - reps[:, 2]) - (reps[:, 1] - reps[:, 0]),
                    len(seeds)) | {"seeds": len(seeds), "scenes": n.shape[2]}


def hierarchical_tau(runs: dict, null: float, seed: int = 0, boot: int = BOOT) -> dict:
    """One group's tau with the shared-scene interval, and the p of tau = `null` (a paper's number)."""
    seeds = sorted(runs)
    n, f = tau_arrays(runs, seeds)
    reps = two_level(n[None], f[None], seed, boot)[:, 0]
    return _summary(n.sum() / f.sum(), reps, len(seeds), null) | {"seeds": len(seeds), "scenes": n.shape[1]}


def hierarchical_mean_diff(a: dict, b: dict, value, seed: int = 0, boot: int = BOOT) -> dict:
    """mean over seeds and scenes of value(record) in b minus in a (e.g. attention mass on history
    keys), with the shared-scene interval."""
    seeds = _common(a, b)
    va = np.array([[value(r) for r in a[s]["per_scene"]] for s in seeds], float)
    vb = np.array([[value(r) for r in b[s]["per_scene"]] for s in seeds], float)
    ones = np.ones_like(va)
    reps = two_level(np.stack([va, vb]), np.stack([ones, ones]), seed, boot)
    return _summary(vb.mean() - va.mean(), reps[:, 1] - reps[:, 0], len(seeds)) | \
        {"seeds": len(seeds), "scenes": va.shape[1]}


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given."""
    order = np.argsort(ps)
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def verdicts(tests: list[dict], alpha: float = 0.05) -> list[dict]:
    """Each test (hierarchical_diff's dict, the claim predicting a positive difference) with its
    Holm-adjusted p over the family, the effect it could have detected (80 % power at the family's
    strictest level alpha / m: (t(1 - alpha / 2m) + t(power)) x se, t with the test's seeds - 1
    degrees of freedom; the normal for a test that names no seeds) and a verdict: "holds"
    (adjusted p < alpha and a positive difference), "does not hold" (adjusted p < alpha and a
    negative one), else "not resolved at this power"."""
    adjusted = holm([t["p"] for t in tests])
    q = 1 - alpha / (2 * max(len(tests), 1))
    out = []
    for t, p in zip(tests, adjusted):
        df = max(t["seeds"] - 1, 1) if "seeds" in t else float("inf")
        verdict = ("holds" if t["point"] > 0 else "does not hold") if p < alpha else "not resolved at this power"
        out.append({**t, "p_holm": p, "detectable": (t_ppf(q, df) + t_ppf(POWER, df)) * t["se"], "verdict": verdict})
    return out
