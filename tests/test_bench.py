"""The bench machinery on the numpy table backend with a fake clock (tests/table_backend.py):
simulated call costs make every time exact, so the measured decode-phase speedup must equal
the ideal tau / mean(k c + v(k+1)) (no loop overhead exists in fake time), c and v must be the
simulated cost ratios, speculative output must equal plain decoding on every scene, and the
per-token provenance must agree with the runtime's own step statistics. Plus the formulas and
the labelling on hand-made cases, and an identity check that fails when the target differs."""
import json

import numpy as np
import pytest

from core.config import ConfigError
from runtime.step import Chain, StepRecord
from table_backend import TableBackend
from runtime.budget import FakeClock
from runtime.config import PlannerConfig
from bench.common.sources import default_tokenizer
from bench.common import accept_map
from bench.bench.command import bench_scenes
from bench.bench.measure import BenchConfig, make_modes, run_bench
from bench.common.stats import ideal_speedup, loss_factors

T_VERIFY, T_PER_TOKEN, T_DRAFT = 10.0, 0.5, 1.0     # ms: verify(w) = 10 + 0.5 (w - 1); draft 1 per token


def verify_ms(width: int) -> float:
    return T_VERIFY + T_PER_TOKEN * (width - 1)


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


def table(tok, clock, seed=3, noise=0.0):
    costs = {"vision": 5.0, "prefill": 20.0, "action": 7.0, "draft": T_DRAFT, "verify": verify_ms}
    return TableBackend(vocab_size=len(tok), max_len=1024, seed=seed, draft_noise=noise,
                        stop_id=tok.cot_end, stop_slope=0.3, clock=clock, costs=costs)


def run_table(tok, cfg, drafts):
    clock = FakeClock()
    plain = table(tok, clock)
    backends = {name: table(tok, clock, **kw) for name, kw in drafts.items()}
    modes = make_modes(backends, plain, cfg)
    base = PlannerConfig(max_reasoning_tokens=24)
    return run_bench(modes, bench_scenes(cfg), tok, base, cfg, clock=clock)


@pytest.fixture(scope="module")
def record(tok):
    cfg = BenchConfig(scenes=4, seed=11, repeats=2, warmup=1, ks=(2, 5), deadline_ms=0.0)
    return run_table(tok, cfg, {"exact": {}, "noisy": {"noise": 0.3}})


def test_record_is_json_with_every_field(record):
    text = json.dumps(record)          # plain JSON types only
    back = json.loads(text)
    assert back["schema"] == "specdrive-bench/1"
    assert [m["name"] for m in back["modes"]] == ["plain", "exact k=2", "exact k=5", "exact adaptive",
                                                   "noisy k=2", "noisy k=5", "noisy adaptive"]
    for m in back["modes"][1:]:
        for key in ("tau", "tokens_per_s", "decode_speedup", "vision_ms", "prefill_ms", "cycle_ms",
                    "identical", "deadline_misses", "c", "verify_ratio", "ideal_speedup",
                    "efficiency", "factors", "note"):
            assert key in m, key
        assert set(back["where_accepted"][m["name"]]["by_class"]) == {"routine", "commitment"}


def test_speculative_output_equals_plain_on_every_scene(record):
    plain = {c["scene"]: c["words"] for c in record["cycles"] if c["mode"] == "plain"}
    for m in record["modes"][1:]:
        mine = {c["scene"]: c["words"] for c in record["cycles"] if c["mode"] == m["name"]}
        assert mine == plain, m["name"]
        assert m["identical"] == {"scenes": 4, "equal": 4, "fraction": 1.0, "differing_scenes": []}
        assert m["trajectory_max_diff_m"] == 0.0
    stops = [c["stop_reason"] for c in record["cycles"] if c["mode"] == "plain"]
    assert "stop" in stops, "no scene reached <|cot_end|>: the stop-in-block paths go untested"


def test_costs_and_speedup_equal_the_simulated_ones(record):
    assert record["target_step_ms"] == pytest.approx(T_VERIFY)
    for m in record["modes"][1:]:
        assert m["c"] == pytest.approx(T_DRAFT / T_VERIFY, abs=1e-4)
        for w, v in m["verify_ratio"].items():
            assert v == pytest.approx(verify_ms(int(w)) / T_VERIFY, abs=1e-4)
        # fake time moves only inside backend calls: no loop overhead, measured == ideal
        assert m["decode_speedup"]["all"] == pytest.approx(m["ideal_speedup"], rel=1e-3)
        assert m["efficiency"] == pytest.approx(1.0, abs=1e-3)
        assert m["loop_overhead_share"] == pytest.approx(0.0, abs=1e-6)
        f = m["factors"]
        k = m["k_mean"]
        product = (k + 1) * f["acceptance"] * f["verify_width"] * f["draft_cost"] * f["loop_overhead"]
        assert product == pytest.approx(m["decode_speedup"]["all"], rel=2e-3)


def test_exact_draft_is_always_accepted(record):
    for name in ("exact k=2", "exact k=5"):
        wa = record["where_accepted"][name]
        assert wa["all"]["accept_rate"] == 1.0
        labels = [lab for c in record["cycles"] if c["mode"] == name for lab in c["labels"]]
        assert "corrected" not in labels and "bonus" in labels
    noisy = record["where_accepted"]["noisy k=5"]["all"]["accept_rate"]
    assert 0.0 < noisy < 1.0, f"the noised draft should be partly rejected, accept rate {noisy}"


def test_provenance_agrees_with_the_runtime_stats(record):
    for c in record["cycles"]:
        if c["mode"] == "plain":
            assert set(c["labels"]) <= {"prefill", "target", "forced"}
            continue
        d, labels = c["decode"], c["labels"]
        in_block = d["branches"].get("stop_in_block", 0)
        own = sum(lab in ("corrected", "bonus", "target") for lab in labels)
        assert own + in_block == d["steps"], c
        assert labels.count("draft") + own == d["emitted"], c
        if not in_block:          # an accepted stop drops the accepted tokens after it
            assert labels.count("draft") == d["accepted"], c


def test_class_split_adds_up_to_the_mode_tau(record):
    for m in record["modes"][1:]:
        wa = record["where_accepted"][m["name"]]
        parts = wa["by_class"].values()
        assert sum(p["tokens"] for p in parts) == wa["all"]["tokens"]
        assert wa["all"]["tau"] == pytest.approx(m["tau"], abs=1e-3)
        fam_tokens = sum(f["all"]["tokens"] for f in wa["by_family"].values())
        assert fam_tokens == wa["all"]["tokens"]


def test_identity_check_catches_a_different_target(tok):
    cfg = BenchConfig(scenes=2, seed=5, repeats=1, warmup=0, ks=(3,), adaptive=False)
    rec = run_table(tok, cfg, {"other": {"seed": 4}})
    ident = rec["modes"][1]["identical"]
    assert ident["fraction"] < 1.0 and ident["differing_scenes"], ident


def test_ideal_speedup_formula():
    for tau, k, c in [(3.2, 4, 0.1), (5.0, 4, 0.0), (1.0, 8, 0.25)]:
        assert ideal_speedup(tau, [k] * 7, c, lambda w: 1.0) == pytest.approx(tau / (1 + k * c))
        v = lambda w: 1.0 + 0.05 * (w - 1)          # noqa: E731
        assert ideal_speedup(tau, [k] * 3, c, v) == pytest.approx(tau / (k * c + v(k + 1)))
    # adaptive k: the mean of the per-step costs
    assert ideal_speedup(3.0, [2, 4], 0.5, lambda w: 1.0) == pytest.approx(3.0 / ((2 + 3) / 2))
    f = loss_factors(tau=3.0, k_mean=4.0, c=0.1, v_mean=1.2, efficiency=0.9)
    assert f["limited_by"] == "acceptance"
    assert 5 * f["acceptance"] * f["verify_width"] * f["draft_cost"] * f["loop_overhead"] == \
        pytest.approx(3.0 / (0.4 + 1.2) * 0.9, rel=1e-3)


def step(draft):
    return StepRecord(Chain(len(draft)), len(draft), np.asarray(draft, np.int64), 0, len(draft) + 1, 1.0, 2.0)


def test_labels_on_hand_made_steps():
    stop = 99
    gen = [10, 11, 12, 13, 14, 15, stop]
    steps = [step([11, 12]),          # both accepted, 13 is the bonus
             step([14, 7, 7]),        # 14 accepted, 15 corrects the second
             step([]),                # a plain step: the stop
             ]
    labels, owner = accept_map.label_tokens(steps, gen, forced_end=False)
    assert labels == ["prefill", "draft", "draft", "bonus", "draft", "corrected", "target"]
    assert owner == [-1, 0, 0, 0, 1, 1, 2]
    rec = accept_map.cycle_record(steps, gen, 3, forced_end=False)
    assert rec["judged"] == {"routine": 2, "commitment": 2}      # 11 12 | 14 and the rejected 7
    # an accepted stop inside a block ends the step without a target token
    labels, _ = accept_map.label_tokens([step([11, stop, 5])], [10, 11, stop], forced_end=False)
    assert labels == ["prefill", "draft", "draft"]
    rec = accept_map.cycle_record([step([11, stop, 5])], [10, 11, stop], 9, False)
    assert rec["judged"] == {"routine": 2, "commitment": 0}      # the 5 after the stop was never judged
    # a forced <|cot_end|> is nobody's proposal
    labels, _ = accept_map.label_tokens([step([11])], [10, 11, 12, stop], forced_end=True)
    assert labels == ["prefill", "draft", "bonus", "forced"]
    with pytest.raises(ValueError, match="explain"):
        accept_map.label_tokens([step([11])], gen, forced_end=False)


def test_routine_commitment_split():
    from train.vocab import build_tokenizer

    tok = build_tokenizer(n=2000)
    routine = "ego is driving at 9.1 m/s , holding a steady speed , going straight ,"
    text = routine + " the signal ahead shows red , so stop"
    n = accept_map.routine_tokens(tok, text)
    assert n == len(tok.encode(routine)) and 0 < n < len(tok.encode(text))
    assert accept_map.routine_tokens(tok, "a flying pig , so stop") == 0     # no routine clause parses
    assert accept_map.token_classes(3, 2) == ["routine", "routine", "commitment"]


def test_bad_bench_config_names_the_value():
    with pytest.raises(ConfigError, match="scenes=0"):
        BenchConfig(scenes=0)
    with pytest.raises(ConfigError, match="ks=17"):
        BenchConfig(ks=(4, 17))
    with pytest.raises(ConfigError, match="no speculative mode"):
        BenchConfig(ks=(), adaptive=False)
    with pytest.raises(ConfigError, match="--aa copies the longest fixed chain"):
        BenchConfig(ks=(), aa=True)


def test_issue_bar_needs_speed_identity_and_efficiency():
    from bench.bench.report import criterion

    def rec(speedup, eff, fraction):
        mode = {"name": "flat k=8", "decode_speedup": {"all": speedup}, "efficiency": eff,
                "identical": {"fraction": fraction}, "factors": {"limited_by": "acceptance"}}
        return {"best": "flat k=8", "modes": [{"name": "plain"}, mode]}
    assert criterion(rec(2.6, 0.9, 1.0))["met"]
    assert not criterion(rec(2.4, 0.9, 1.0))["met"]
    assert not criterion(rec(2.6, 0.8, 1.0))["met"]
    assert not criterion(rec(2.6, 0.9, 0.95))["met"]
    assert criterion({"best": None, "modes": []})["met"] is False


def test_each_scene_runs_the_modes_in_its_own_drawn_order(tok, monkeypatch):
    """A fixed order puts a mode always after the same mode, at the same place in the round; the
    bench draws the order per scene and round (mode_order), the same in every run."""
    import bench.bench.measure as measure
    from bench.common.stats import mode_order
    seen = []
    real = measure.timed_cycle
    monkeypatch.setattr(measure, "timed_cycle", lambda planner, scene: seen.append((scene.name, planner)) or real(planner, scene))
    cfg = BenchConfig(scenes=4, seed=5, repeats=2, warmup=0, ks=(2, 5), deadline_ms=0.0)
    clock = FakeClock()
    plain, draft = table(tok, clock), table(tok, clock)
    modes = make_modes({"exact": draft}, plain, cfg)
    monkeypatch.setattr(measure, "Planner", _Named(measure.Planner, modes))
    run_bench(modes, bench_scenes(cfg), tok, PlannerConfig(max_reasoning_tokens=24), cfg, clock=clock)
    names = [p.mode for _, p in seen]
    rounds = [names[j:j + len(modes)] for j in range(0, len(names), len(modes))]
    assert len(rounds) == cfg.repeats * cfg.scenes
    want = [[m.name for m in mode_order(modes, cfg.seed, r, i)] for r in range(cfg.repeats) for i in range(cfg.scenes)]
    assert rounds == want
    assert all(sorted(r) == sorted(m.name for m in modes) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1                  # not one fixed order
    assert mode_order(modes, cfg.seed, 1, 2) == mode_order(modes, cfg.seed, 1, 2)


class _Named:
    """Planner factory that tags each planner with its mode's name (the mode whose step list its
    observer appends to)."""

    def __init__(self, cls, modes):
        self.cls, self.modes = cls, modes

    def __call__(self, backend, tok, config, clock=None, observer=None):
        p = self.cls(backend, tok, config, clock=clock, observer=observer)
        p.mode = next(m.name for m in self.modes if observer.__self__ is m.steps)
        return p


def test_an_aa_control_is_the_longest_chain_again_and_its_gap_is_the_runs_noise(tok):
    """--aa: each draft's longest chain a second time, the same work in the same run. On the table
    backend's fake clock every call costs what it is priced, so the copy measures exactly what its
    original does (gap 0); on a real machine the gap is the run's noise. The copy is never `best`."""
    from bench.bench import report
    cfg = BenchConfig(scenes=3, seed=2, repeats=2, warmup=0, ks=(2, 5), aa=True, deadline_ms=0.0)
    rec = run_table(tok, cfg, {"exact": {}, "noisy": {"noise": 0.3}})
    names = [m["name"] for m in rec["modes"]]
    assert names[-2:] == ["exact k=5 (A/A)", "noisy k=5 (A/A)"]
    assert [a["mode"] for a in rec["aa"]] == ["exact k=5", "noisy k=5"]
    by = {m["name"]: m for m in rec["modes"]}
    for a in rec["aa"]:
        assert a["speedup"] == by[a["mode"]]["decode_speedup"]["all"]
        assert a["copy_speedup"] == by[a["mode"] + " (A/A)"]["decode_speedup"]["all"]
        assert a["gap"] == 0.0
    rec["modes"][-1]["decode_speedup"]["all"] = 99.0            # a copy that would be the fastest
    assert not report.best_mode(rec).endswith("(A/A)")
    assert any("A/A control: exact k=5" in line for line in report.aa_lines(rec))


class _FailingDraft(TableBackend):
    """A draft whose every call fails: its modes have no successful reasoning."""
    def draft(self, tokens, start: int, k: int, sampling=None):
        raise RuntimeError("draft failed (test)")


def test_a_mode_with_no_successful_cycle_shows_a_dash_and_the_plot_is_drawn(tok, tmp_path):
    """Issue 50, 4: a mode whose every cycle failed crashed the plot (TypeError) after the whole
    run and wrote no JSON; the table and the plot show '-' for what it did not measure."""
    from bench.bench import report

    clock = FakeClock()
    costs = {"vision": 5.0, "prefill": 20.0, "action": 7.0, "draft": T_DRAFT, "verify": verify_ms}
    broken = _FailingDraft(vocab_size=len(tok), max_len=1024, seed=3, stop_id=tok.cot_end, stop_slope=0.3,
                           clock=clock, costs=costs)
    cfg = BenchConfig(scenes=2, seed=11, repeats=1, warmup=0, ks=(2,), adaptive=False, deadline_ms=0.0)
    modes = make_modes({"broken": broken}, table(tok, clock), cfg)
    rec = run_bench(modes, bench_scenes(cfg), tok, PlannerConfig(max_reasoning_tokens=24), cfg, clock=clock)
    m = next(x for x in rec["modes"] if x["name"] == "broken k=2")
    assert m["decode_speedup"]["all"] is None and m["errors"] + m["identical"]["scenes"] > 0, m
    row = next(line for line in report.table(rec).splitlines() if line.startswith("broken k=2"))
    assert " - " in row, row
    assert "| broken k=2 |" in report.markdown_table(rec)
    report.plot_bench(tmp_path / "b.png", rec)
    assert (tmp_path / "b.png").stat().st_size > 0
