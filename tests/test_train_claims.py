"""The claims numbers: the budgeted greedy loop, bootstrap intervals over scenes, paired
differences, draft grouping by run folder, and config overrides from the command line."""
import numpy as np
import pytest

from core.config import ConfigError
from train import claims, claims_report, config, metrics


def test_emitted_within_a_budget_of_passes():
    first, end, k = 10, 40, 4
    all_ok = np.ones((k, 60), bool)
    none = np.zeros((k, 60), bool)
    assert metrics.emitted_within(all_ok, first, end, k, 2) == 2 * (k + 1)
    assert metrics.emitted_within(all_ok, first, end, k, 100) == end - first     # never past <|cot_end|>
    assert metrics.emitted_within(none, first, end, k, 3) == 3                    # plain decoding
    some = none.copy()
    some[:2, first] = True                          # the first step accepts 2 drafted tokens
    assert metrics.emitted_within(some, first, end, k, 1) == 3
    assert metrics.emitted_within(some, first, end, k, 2) == 4
    steps = metrics.greedy_steps(some, first, end, k)
    assert sum(e for _, e in steps) == end - first and len(steps) == metrics.greedy_tau(some, first, end, k)[1]


def _rec(n, f, rout=(9, 10), comm=(4, 5), free=(6, 2)):
    return {"n": n, "f": f, "routine": list(rout), "commitment": list(comm), "free": list(free)}


def test_intervals_bracket_the_ratio_of_sums_and_shrink_to_it_without_spread():
    same = [_rec(10, 2)] * 30
    iv = claims.intervals(same)
    assert iv["tau"] == [5.0, 5.0, 5.0] and iv["alpha_routine"] == pytest.approx([0.9, 0.9, 0.9])
    rng = np.random.default_rng(1)
    spread = [_rec(int(n), int(f)) for n, f in zip(rng.integers(20, 60, 40), rng.integers(4, 12, 40))]
    point, lo, hi = claims.intervals(spread)["tau"]
    assert point == pytest.approx(sum(r["n"] for r in spread) / sum(r["f"] for r in spread))
    assert lo < point < hi


def test_paired_difference():
    a = np.arange(20, dtype=float)
    assert claims.paired(a, a + 1.5) == pytest.approx([1.5, 1.5, 1.5])
    d, lo, hi = claims.paired(a, a[::-1])
    assert d == pytest.approx(0.0) and lo < 0 < hi


def test_drafts_are_grouped_by_their_run_folder():
    assert claims_report.group_of("runs/claims-distill/mrope-standalone-s2/ckpt/draft-mrope-standalone") == \
        ("mrope-standalone", "2")
    assert claims_report.group_of("runs/claims-aarl/onepass-aw1-kl0.1/ckpt/draft-flat-aarl") == \
        ("aarl onepass-aw1-kl0.1", "0")
    assert claims_report.group_of("runs/claims-aarl/rollout-s1/ckpt/draft-flat-aarl") == ("aarl rollout", "1")
    assert claims_report.group_of("draft-flat") == ("flat", "shipped")


def test_config_overrides_from_the_command_line(tmp_path):
    path = tmp_path / "aarl.yaml"
    path.write_text("kl_coef: 0.1\nrun: {out: runs/a, steps: 3}\n")
    cfg = config.load("aarl", path, ["kl_coef=0.01", "run.steps=7", "action_on=one_pass"])
    assert (cfg.kl_coef, cfg.run.steps, cfg.run.out, cfg.action_on) == (0.01, 7, "runs/a", "one_pass")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        config.load("aarl", path, ["kl_coef"])
    with pytest.raises(ConfigError, match="unknown key"):
        config.load("aarl", path, ["kl_cof=1"])
    with pytest.raises(ConfigError, match="action_on"):
        config.load("aarl", path, ["action_on=sometimes"])


def _seeded(tau: float, seed_sd: float, rng, seeds=5, scenes=80) -> dict:
    """{seed: per-scene records}: each training seed shifts tau by N(0, seed_sd), each scene by N(0, 0.5)."""
    out = {}
    for s in range(seeds):
        shift = rng.normal(0, seed_sd)
        out[str(s)] = {"per_scene": [_rec(20 * max(tau + shift + rng.normal(0, 0.5), 1.0), 20) for _ in range(scenes)]}
    return out


def test_the_seed_level_interval_carries_the_spread_between_seeds():
    rng = np.random.default_rng(0)
    a, b = _seeded(5.0, 0.4, rng), _seeded(5.0, 0.4, rng)        # no true difference, seeds spread
    seed_level = claims.hierarchical_diff(a, b)
    scene_level = claims_report.tau_diff(a, b)
    assert seed_level["hi"] - seed_level["lo"] > 2 * (scene_level[2] - scene_level[1])
    assert seed_level["lo"] < 0 < seed_level["hi"] and seed_level["p"] > 0.05
    tight = claims.hierarchical_diff(_seeded(5.0, 0.0, rng), _seeded(5.6, 0.0, rng))    # a real +0.6, no seed spread
    assert tight["lo"] > 0.3 and tight["p"] < 0.01 and abs(tight["point"] - 0.6) < 0.15
    with pytest.raises(ValueError, match="no seed is in both"):
        claims.hierarchical_diff(a, {"9": b["0"]})


def _shared_world(rng, seeds=5, scenes=200, seed_sd=0.1, scene_sd=1.0, noise_sd=0.3, tau=5.5):
    """(n, f) arrays (1, seeds, scenes): tau of seed s on scene j = tau + seed effect + scene effect
    (the same scene for every seed) + noise; 20 target passes per scene. Returns the arrays and the
    true standard deviation of the ratio of sums over new seeds and new scenes."""
    t = (tau + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, scene_sd, (1, scenes))
         + rng.normal(0, noise_sd, (seeds, scenes)))
    true_sd = np.sqrt(seed_sd ** 2 / seeds + scene_sd ** 2 / scenes + noise_sd ** 2 / (seeds * scenes))
    return (20 * t)[None], np.full((1, seeds, scenes), 20.0), true_sd


def test_the_shared_scene_bootstrap_covers_the_true_spread_and_the_nested_one_does_not():
    """Every seed scored on the same scenes (one evaluation): the standard error of the shared-scene
    bootstrap is within 20 % of the true spread (averaged over 30 synthetic worlds); resampling the
    scenes within each seed counts each scene once per seed and comes out far too narrow."""
    rng = np.random.default_rng(0)
    ratios = {True: [], False: []}
    covered = 0
    for w in range(30):
        n, f, true_sd = _shared_world(rng)
        for shared in (True, False):
            ratios[shared].append(claims.two_level(n, f, seed=w, shared=shared)[:, 0].std() / true_sd)
        runs = {str(s): {"per_scene": [{"n": n[0, s, j], "f": f[0, s, j]} for j in range(n.shape[2])]}
                for s in range(n.shape[1])}
        t = claims.hierarchical_tau(runs, null=5.5, seed=w)
        covered += t["lo"] <= 5.5 <= t["hi"]
        assert t["design"] == claims.SHARED and t["df"] == 4
    assert abs(np.mean(ratios[True]) - 1) < 0.2, np.mean(ratios[True])
    assert np.mean(ratios[False]) < 0.8, np.mean(ratios[False])
    assert covered >= 26                      # 95 % intervals: 28.5 of 30 expected


def test_t_quantiles_and_distribution():
    assert claims.t_ppf(0.975, 4) == pytest.approx(2.776, abs=1e-3)       # a t table's values
    assert claims.t_ppf(0.80, 4) == pytest.approx(0.941, abs=1e-3)
    assert claims.t_ppf(0.995, 1) == pytest.approx(63.657, abs=1e-2)
    assert claims.t_ppf(0.975, float("inf")) == pytest.approx(1.960, abs=1e-3)
    assert claims.t_cdf(0.0, 4) == pytest.approx(0.5) and claims.t_cdf(-2.776, 4) == pytest.approx(0.025, abs=1e-4)
    with pytest.raises(ValueError, match="must be in"):
        claims.t_ppf(1.0, 4)


def test_holm_and_the_verdicts():
    assert claims.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    tests = [{"point": 0.6, "p": 0.001, "se": 0.1}, {"point": -0.5, "p": 0.002, "se": 0.1},
             {"point": 0.2, "p": 0.03, "se": 0.1}, {"point": 0.1, "p": 0.2, "se": 0.1}]
    v = claims.verdicts(tests)
    # 0.03 alone would pass 0.05; third of four under Holm it is 0.03 x 2
    assert [t["verdict"] for t in v] == ["holds", "does not hold", "not resolved at this power",
                                         "not resolved at this power"]
    assert [t["p_holm"] for t in v] == pytest.approx([0.004, 0.006, 0.06, 0.2])
    assert v[0]["detectable"] == pytest.approx((2.498 + 0.8416) * 0.1, abs=0.01)     # z(1 - 0.05 / 8)
    five = claims.verdicts([dict(t, seeds=5) for t in tests])                       # t with 4 degrees of freedom
    assert five[0]["detectable"] == pytest.approx((claims.t_ppf(1 - 0.05 / 8, 4) + 0.941) * 0.1, abs=1e-3)
    assert five[0]["detectable"] > 1.4 * v[0]["detectable"]


def test_one_group_against_a_papers_number_and_a_mean_difference():
    rng = np.random.default_rng(1)
    runs = _seeded(5.5, 0.2, rng)
    t = claims.hierarchical_tau(runs, null=4.6)
    assert t["lo"] < 5.5 < t["hi"] and t["lo"] > 4.6 and t["p"] < 0.01
    assert claims.hierarchical_tau(runs, null=5.5)["p"] > 0.05
    other = {s: {"per_scene": [dict(r, x=r["n"] / r["f"]) for r in v["per_scene"]]} for s, v in runs.items()}
    for v in runs.values():
        for r in v["per_scene"]:
            r["x"] = 1.0
    d = claims.hierarchical_mean_diff(runs, other, lambda r: r["x"])
    assert d["lo"] < d["point"] < d["hi"] and abs(d["point"] - 4.5) < 0.3


def test_the_verdict_table_gives_every_claim_a_seed_level_interval_and_a_verdict():
    rng = np.random.default_rng(2)

    def group(path, tau, history):
        runs = _seeded(tau, 0.05, rng, seeds=3, scenes=40)
        for v in runs.values():
            for r in v["per_scene"]:
                r["attn"] = {"history": [history + rng.normal(0, 0.01)]}
        return {f"runs/{path}-s{s}/ckpt/draft-{path.split('/')[-1]}": v for s, v in runs.items()}

    drafts = {**group("claims-distill/flat", 6.0, 0.20), **group("claims-distill/mrope", 5.0, 0.20)}
    rows = claims_report.verdict_table({"test": {"drafts": drafts}})
    fused = next(r for r in rows if r.startswith("| FlatRoPE raises acceptance (fused"))
    assert "| holds |" in fused and "3 x 40" in fused
    history = next(r for r in rows if r.startswith("| FlatRoPE turns attention to the history (fused"))
    assert "not resolved at this power" in history
    block = next(r for r in rows if "blocks of ~4.6" in r)
    assert "holds: more than the paper's" in block
