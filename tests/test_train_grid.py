"""Grids that build up across sessions (train.grid): cells named from their axes, finished cells
skipped, a failed cell leaves nothing in the results folder, another target's result is run
again, the budget stops before a cell it cannot fit; the dose-response's position gap."""
import json

import numpy as np
import pytest
import torch

from core.config import ConfigError
from train import ckpt, grid

PLANNER = "checkpoints/tiny"


def _grid(tmp_path, **kw) -> grid.GridConfig:
    spec = {"name": "g", "stage": "aarl", "base": "configs/train/aarl.yaml", "planner": PLANNER,
            "set": ("draft=checkpoints/tiny/draft-flat",),
            "groups": {"a": {"axes": {"run.lr": [1e-5, 2e-5], "run.seed": [0, 1]}},
                       "ctl": {"set": ["kl_coef=0.0"], "axes": {"run.seed": [0]}}},
            "results": str(tmp_path / "results"), "work": str(tmp_path / "work")}
    return grid.GridConfig(**{**spec, **kw})


def _doubles(tmp_path, calls: list, fail: str = ""):
    def train(stage, cfg):
        name = cfg.run.out.split("/")[-1]
        calls.append(name)
        if name == fail:
            raise RuntimeError("the cell's training failed")
        draft = tmp_path / "trained" / name / "draft-flat-aarl"
        draft.mkdir(parents=True, exist_ok=True)
        (draft / "draft.safetensors").write_bytes(b"weights of " + name.encode())
        (draft / "meta.json").write_text("{}")
        return draft, cfg.draft

    def score(g, cfg, draft, init):
        return {"lr": cfg.run.lr, "seed": cfg.run.seed, "kl_coef": cfg.kl_coef}
    return train, score


def test_cells_are_the_product_of_each_groups_axes_with_the_settings_in_their_names(tmp_path):
    g = _grid(tmp_path)
    got = grid.cells(g)
    assert [c.name for c in got] == ["a-lr1e-05-seed0", "a-lr1e-05-seed1", "a-lr2e-05-seed0", "a-lr2e-05-seed1",
                                     "ctl-seed0"]
    assert got[-1].overrides == ("draft=checkpoints/tiny/draft-flat", "kl_coef=0.0", "run.seed=0")
    assert got[2].overrides[1] == "run.lr=2.0e-05"
    cfg = grid.stage_config(g, got[2])
    assert (cfg.run.lr, cfg.run.seed, cfg.target) == (2e-5, 0, PLANNER)
    assert cfg.run.out == str(tmp_path / "work" / "g" / "a-lr2e-05-seed0")
    with pytest.raises(ConfigError, match="share a name"):
        grid.cells(_grid(tmp_path, groups={"a": {"axes": {"run.seed": [0, 0]}}}))
    with pytest.raises(ConfigError, match="groups.a"):
        _grid(tmp_path, groups={"a": {"axis": {"run.seed": [0]}}})


def test_a_grid_runs_over_calls_skips_finished_cells_and_commits_only_finished_ones(tmp_path):
    calls = []
    train, score = _doubles(tmp_path, calls, fail="a-lr2e-05-seed0")
    g = _grid(tmp_path, max_cells=2)
    assert "2 cells run now, 2/5" in grid.run(g, train, score)
    assert calls == ["a-lr1e-05-seed0", "a-lr1e-05-seed1"]
    with pytest.raises(RuntimeError):
        grid.run(g, train, score)             # the third cell fails in training
    root = tmp_path / "results" / "g"
    assert sorted(p.name for p in root.iterdir()) == ["a-lr1e-05-seed0", "a-lr1e-05-seed1"]   # no partial cell
    m = json.loads((root / "a-lr1e-05-seed1" / "metrics.json").read_text())
    assert m["target_sha256"] == ckpt.target_sha256(PLANNER) and m["stamp"]["fingerprint"]
    assert m["scores"] == {"lr": 1e-5, "seed": 1, "kl_coef": 0.1}
    assert (root / "a-lr1e-05-seed1" / "draft-flat-aarl" / "draft.safetensors").read_bytes() == b"weights of a-lr1e-05-seed1"
    calls.clear()
    train, score = _doubles(tmp_path / "second", calls)
    assert "3 cells run now, 5/5" in grid.run(_grid(tmp_path), train, score)
    assert calls == ["a-lr2e-05-seed0", "a-lr2e-05-seed1", "ctl-seed0"]
    calls.clear()
    assert grid.run(_grid(tmp_path), train, score).startswith("grid g: 5/5 cells finished") and calls == []
    summary = json.loads(grid.summary_path(_grid(tmp_path)).read_text())
    assert [(c["setting"], c["seed"]) for c in summary["cells"]] == [
        ("a-lr1e-05", 0), ("a-lr1e-05", 1), ("a-lr2e-05", 0), ("a-lr2e-05", 1), ("ctl", 0)]
    assert summary["settings"] == ["a-lr1e-05", "a-lr2e-05", "ctl"] and summary["stamp"]["fingerprint"]


def test_a_result_of_another_target_settings_or_format_is_run_again(tmp_path):
    calls = []
    train, score = _doubles(tmp_path, calls)
    grid.run(_grid(tmp_path), train, score)
    f = tmp_path / "results" / "g" / "ctl-seed0" / "metrics.json"
    m = json.loads(f.read_text())
    f.write_text(json.dumps({**m, "target_sha256": "0" * 64}))
    moved = _grid(tmp_path, groups={"a": {"axes": {"run.lr": [1e-5, 2e-5], "run.seed": [0, 1]}},
                                    "ctl": {"set": ["kl_coef=0.01"], "axes": {"run.seed": [0]}}})
    calls.clear()
    train, score = _doubles(tmp_path / "again", calls)
    grid.run(_grid(tmp_path), train, score)               # another target's result: run again
    grid.run(moved, train, score)                         # the same cell name with other settings
    assert calls == ["ctl-seed0", "ctl-seed0"]
    assert json.loads(f.read_text())["scores"]["kl_coef"] == 0.01
    g = tmp_path / "results" / "g" / "a-lr1e-05-seed0" / "metrics.json"
    g.write_text(json.dumps({**json.loads(g.read_text()), "format": grid.FORMAT - 1}))
    grid.run(moved, train, score)                         # a result of an older format
    assert calls[-1] == "a-lr1e-05-seed0" and len(calls) == 3


def test_the_budget_starts_no_cell_the_mean_cell_time_says_would_overrun(tmp_path):
    calls = []
    train, score = _doubles(tmp_path, calls)
    grid.run(_grid(tmp_path, max_cells=1), train, score)
    f = tmp_path / "results" / "g" / "a-lr1e-05-seed0" / "metrics.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "wall_s": 3600.0}))
    calls.clear()
    assert "0 cells run now, 1/5" in grid.run(_grid(tmp_path, budget_min=30.0), train, score)
    assert calls == []
    grid.run(_grid(tmp_path, budget_min=90.0, max_cells=1), train, score)
    assert calls == ["a-lr1e-05-seed1"]


def test_a_grid_that_keeps_no_weights_records_their_hash(tmp_path):
    from core.config import file_sha256

    train, score = _doubles(tmp_path, [])
    grid.run(_grid(tmp_path, max_cells=1, keep_weights=False), train, score)
    cell = tmp_path / "results" / "g" / "a-lr1e-05-seed0"
    assert sorted(p.name for p in cell.iterdir()) == ["metrics.json"]
    m = json.loads((cell / "metrics.json").read_text())
    trained = tmp_path / "trained" / "a-lr1e-05-seed0" / "draft-flat-aarl" / "draft.safetensors"
    assert m["weights"] == {"kept": False, "sha256": {"draft.safetensors": file_sha256(trained)}}
    grid.run(_grid(tmp_path, max_cells=1), train, score)      # the default keeps them
    kept = tmp_path / "results" / "g" / "a-lr1e-05-seed1" / "draft-flat-aarl" / "draft.safetensors"
    assert json.loads((kept.parents[1] / "metrics.json").read_text())["weights"]["sha256"] == {
        "draft.safetensors": file_sha256(kept)}


def test_a_cell_resumed_in_a_later_session_counts_the_earlier_sessions_time(tmp_path):
    """wall_s is the cell's whole time: the earlier processes' training (their log's elapsed_s
    restarts in each) plus this process's."""
    g = _grid(tmp_path, max_cells=1)
    run = tmp_path / "work" / "g" / "a-lr1e-05-seed0"
    run.mkdir(parents=True)
    rows = [{"step": 5, "elapsed_s": 100.0}, {"step": 10, "elapsed_s": 700.0},     # a session, killed
            {"step": 8, "elapsed_s": 30.0}, {"step": 12, "elapsed_s": 250.0}]     # the next, killed too
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, score = _doubles(tmp_path, [])
    grid.run(g, train, score)
    m = json.loads((tmp_path / "results" / "g" / "a-lr1e-05-seed0" / "metrics.json").read_text())
    assert m["resumed_after_s"] == 950.0 and 950.0 <= m["wall_s"] < 960.0
    assert grid._earlier_wall(tmp_path / "nowhere") == 0.0


def test_the_position_gap_moves_only_the_reasoning_rows_by_image_regions():
    from models import io
    from train.teachers import Teacher, draft_inputs, image_span
    from train_inputs import examples

    tok, mcfg, target, _ = io.load_planner(PLANNER)
    _, flat, _ = io.load_draft(f"{PLANNER}/draft-flat", mcfg, target)
    _, mrope, _ = io.load_draft(f"{PLANNER}/draft-mrope", mcfg, target)
    ex = examples(1, tok, mcfg.target.vision)[0]
    T = len(ex.ids)
    t = Teacher(ex.ids, ex.positions, ex.reasoning_start, ex.cot_end, torch.zeros(0, 1), torch.zeros(T, 3 * 128),
                None, None)
    rows, span = image_span(t, mcfg.target.image_token_id)
    pads = np.flatnonzero(ex.ids == mcfg.target.image_token_id)
    assert rows == pads[-1] - pads[0] + 3 and 0 < span < rows
    for draft in (flat, mrope):
        seen = {}
        for gap in (0, 2):
            with torch.no_grad():
                _, cos, _, _, _ = draft_inputs([t], draft, tok.pad, gap)
            seen[gap] = cos
        f = t.first
        assert torch.equal(seen[0][:, :f], seen[2][:, :f])
        assert not torch.allclose(seen[0][:, f:], seen[2][:, f:])
        want_shift = 2 * (rows if draft.cfg.rope == "flat" else span)
        pos = torch.arange(T)[None] if draft.cfg.rope == "flat" else torch.from_numpy(ex.positions)[:, None]
        moved = pos.clone()
        moved[..., f:] += want_shift
        assert torch.allclose(seen[2], draft.rope(moved)[0], atol=1e-6)


def test_the_leading_run_reward_scores_what_one_verify_pass_accepts():
    from train.aarl import accept_score
    from train.config import AARLConfig

    match = torch.tensor([1.0, 1.0, 0.0, 1.0])
    assert accept_score(match, AARLConfig()) == 0.75
    assert accept_score(match, AARLConfig(accept_on="leading")) == 0.5
    with pytest.raises(ConfigError, match="accept_on"):
        AARLConfig(accept_on="prefix")


def test_the_grid_table_gives_a_verdict_only_to_a_setting_with_every_seed_and_counts_the_others():
    """claims_report.aarl_grid_table on made-up cells: a setting whose trained draft accepts more
    on every scene of every seed holds, Holm-adjusted over every setting (an unfinished one as
    p = 1); a setting with fewer seeds gets no verdict; one not run says so."""
    from train.claims_report import aarl_grid_table

    rng = np.random.default_rng(0)

    def cell(setting, seed, gain):
        f = rng.integers(5, 9, 100)
        n0 = f * 5 + rng.integers(0, 3, 100)
        init = {"per_scene": [{"n": int(a), "f": int(b)} for a, b in zip(n0, f)], "reward": {"reward": -1.0}}
        draft = {"per_scene": [{"n": int(a + gain * b + rng.integers(-1, 2)), "f": int(b)} for a, b in zip(n0, f)],
                 "reward": {"reward": -0.9}}
        return {"cell": f"{setting}-seed{seed}", "setting": setting, "seed": seed, "wall_s": 60.0,
                "log": {"kl": 0.01}, "scores": {"k": 8, "init": init, "draft": draft}}

    record = {"settings": ["up", "flat", "few", "none"],
              "cells": [cell("up", s, 1) for s in range(3)] + [cell("flat", s, 0) for s in range(3)]
              + [cell("few", 0, 1)]}
    rows = {r.split(" | ")[0].strip("| "): r for r in aarl_grid_table(record)[2:]}
    assert rows["up"].endswith("| holds |") and "| 0, 1, 2 |" in rows["up"]
    assert rows["flat"].endswith("not resolved at this power |")
    assert rows["few"].endswith("1 of 3 seeds: no verdict yet |")
    assert rows["none"].endswith("not run yet |")
    up = float(rows["up"].split(" | ")[4])
    alone = float(aarl_grid_table({**record, "settings": ["up", "flat"]})[2].split(" | ")[4])
    assert up >= alone, (up, alone)        # the unfinished settings count in the adjustment


def test_the_dose_table_judges_each_gap_and_whether_the_gain_grows():
    """claims_report.dose_grid_table on made-up cells on shared scenes: flat gains nothing at gap 0
    and a token per pass at gap 3 -> gap 3 holds, and the dose-response holds; with the gain the
    same at every gap the dose-response is not resolved; a gap missing seeds gets no verdict."""
    from train.claims_report import dose_grid_table

    rng = np.random.default_rng(1)
    f = rng.integers(5, 9, 100)
    base = f * 5 + rng.integers(0, 3, 100)

    def cell(gap, variant, seed, gain):
        n = base + gain * f + rng.integers(-1, 2, 100)
        setting = f"dose-position_gap{gap}-drafts{variant}"
        return {"cell": f"{setting}-seeds{seed}", "setting": setting, "seed": seed,
                "scores": {"k": 8, "position_gap": gap,
                           "draft": {"per_scene": [{"n": int(a), "f": int(b)} for a, b in zip(n, f)]}}}

    def record(gains: dict, seeds=(0, 1, 2)):
        settings = {f"dose-position_gap{g}-drafts{v}": [f"position_gap={g}", f"drafts=[{v}]"]
                    for g in (0, 1, 3) for v in ("flat", "mrope")}
        cells = [cell(g, v, s, gains.get((g, v), 0)) for g in (0, 1, 3) for v in ("flat", "mrope")
                 for s in (seeds if (g, v) != (1, "mrope") else seeds[:1])]
        return {"settings": list(settings), "setting_overrides": settings, "cells": cells}

    rows = dose_grid_table(record({(3, "flat"): 1}))
    by = {r.split(" | ")[0].strip("| "): r for r in rows[2:5]}
    assert by["3"].endswith("| holds |") and "| 4x |" in by["3"]
    assert by["0"].endswith("not resolved at this power |")
    assert by["1"].endswith("3 and 1 of 3 seeds: no verdict yet |")
    assert rows[-1].endswith("holds: the gain grows with the gap.") and "gap 3 minus the gain at gap 0" in rows[-1]
    same = dose_grid_table(record({(0, "flat"): 1, (3, "flat"): 1}))
    assert same[-1].endswith("not resolved at this power.")
    shrinks = dose_grid_table(record({(0, "flat"): 1}))
    assert shrinks[-1].endswith("does not hold: the gain shrinks with the gap.")
    early = dose_grid_table(record({}, seeds=(0,)))
    assert "no verdict until both gaps have 3 seeds" in early[-1]
