"""Every stage end to end on a handful of scenes with the micro preset, as `make train` chains
them: vision pretraining, SFT from the pretrained tower, (resumable: an interrupted run ends where an uninterrupted one does), distillation of
the three drafts, AARL, and the evaluation that prints the model card's numbers."""
import json

import pytest
import torch
import yaml

from models import io
from core.config import ConfigError
from train import config, distill, evaluate, sft, ship, vision
from train import aarl as aarl_stage
from train_inputs import stage_root

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return stage_root(tmp_path_factory.mktemp("stages"), seed=0)


def _cfg(root, stage, body: dict):
    path = root / f"{stage}-{len(list(root.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(body))
    return config.load(stage, path)


def _run(root, out, steps):
    return {"out": str(root / out), "steps": steps, "batch_size": 2, "warmup": 1, "lr": 3e-3,
            "ckpt_every_s": 0, "log_every": 1, "threads": 0}


def _sft(root, out, steps=4, **extra):
    return _cfg(root, "sft", {"preset": str(root / "micro.yaml"), **extra,
                              "data": {"dir": str(root / "scenes"), "max_scenes": 6}, "run": _run(root, out, steps)})


class Interrupt(Exception):
    pass


def test_sft_resume_matches_an_uninterrupted_run(root, monkeypatch):
    whole = sft.run(_sft(root, "sft-whole"))
    real_step = sft.sft_step

    def stop_at_3(target, expert, batch, cfg, traj, step):
        if step == 3:
            raise Interrupt
        return real_step(target, expert, batch, cfg, traj, step)

    cut = _sft(root, "sft-cut")
    cut.run.ckpt_every_s = 1e-9                         # a resumable state after every step
    monkeypatch.setattr(sft, "sft_step", stop_at_3)
    with pytest.raises(Interrupt):
        sft.run(cut)
    monkeypatch.setattr(sft, "sft_step", real_step)
    resumed = sft.run(cut)
    a, _, _ = io.load(whole / "target")
    b, _, _ = io.load(resumed / "target")
    for k in a["target"]:
        assert torch.equal(a["target"][k], b["target"][k]), f"{k} differs after resume"
    rows = [json.loads(r) for r in (root / "sft-cut" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_all_stages_chain_and_the_evaluation_reports(root, monkeypatch):
    tower = vision.run(_cfg(root, "vision", {"preset": str(root / "micro.yaml"), "val_scenes": 2,
                                             "data": {"dir": str(root / "scenes"), "max_scenes": 6, "balance": 1.0},
                                             "run": _run(root, "vision", 2)}))
    target = sft.run(_sft(root, "sft", steps=3, init_vision=str(tower)))
    tok, cfg, _, _ = io.load_planner(target)
    assert len(tok) == cfg.target.llm.vocab_size
    dcfg = _cfg(root, "distill", {"target": str(target), "data": {"dir": str(root / "scenes"), "max_scenes": 4},
                                  "max_new_tokens": 6, "gen_batch": 4, "run": _run(root, "distill", 2)})
    drafts = distill.run(dcfg)
    assert [p.name for p in drafts] == ["draft-flat", "draft-mrope", "draft-flat-standalone"]
    log = [json.loads(r) for r in (root / "distill" / "flat-s0" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"] * 1.5 and "acc3" in log[0]
    acfg_path = root / "aarl.yaml"
    acfg_path.write_text(yaml.safe_dump({"target": str(target), "draft": str(drafts[0]), "group": 2,
                                         "max_new_tokens": 5, "data": {"dir": str(root / "scenes"), "max_scenes": 4},
                                         "run": _run(root, "aarl", 2)}))
    acfg = config.load("aarl", acfg_path)
    post = aarl_stage.run(acfg)
    rows = [json.loads(r) for r in (root / "aarl" / "log.jsonl").read_text().splitlines()]
    assert {"reward", "kl", "accepted", "ade"} <= set(rows[0]) and rows[0]["kl"] == pytest.approx(0, abs=1e-6)
    shipped = ship.run(_cfg(root, "ship", {"sft": str(target), "out": str(root / "shipped"), "drafts": {
        "flat": str(drafts[0]), "mrope": str(drafts[1]), "flat-standalone": str(drafts[2]), "flat-aarl": str(post)}}))
    with pytest.raises(ConfigError, match="variant"):
        ship.run(_cfg(root, "ship", {"sft": str(target), "out": str(root / "bad"), "drafts": {"mrope": str(drafts[0])}}))
    ecfg = _cfg(root, "eval", {"planner": shipped, "splits": ["test"], "max_new_tokens": 6, "k": 3,
                               "runtime_scenes": 2, "aarl_scenes": 2, "aarl_config": str(acfg_path),
                               "budget_action": True, "claims": str(root / "claims.md"),
                               "data": {"dir": str(root / "scenes"), "max_scenes": 2},
                               "out": str(root / "metrics.json"), "card": str(root / "CARD.md"),
                               "vision_run": str(root / "vision"), "sft_run": str(root / "sft"), "distill_run": str(root / "distill"),
                               "aarl_run": str(root / "aarl"), "compare": [str(root / "metrics.json")],
                               "commands": ["specdrive train eval --config X"]})
    evaluate.run(ecfg)
    card = (root / "CARD.md").read_text()
    m = json.loads((root / "metrics.json").read_text())      # the card opens with its planner and stamp
    assert card.startswith(f"# {shipped} — model card") and m["stamp"]["fingerprint"] in card.split("## ")[0]
    assert m["image_attention"] == cfg.target.llm.image_attention      # side by side: one row per draft
    assert f"| `{shipped}` | {m['image_attention']} | test | 2 |" in card.split("## Side by side")[1]
    assert "specdrive train eval --config X" in card and "train distill" not in card.split("## Commands")[1]
    assert "vision pretraining: 2 steps" in card and "val scenes" in card
    fp = m["stamp"]["fingerprint"]                   # every results block of the card: the metrics' stamp
    opened = [x for x in card.splitlines() if x.startswith("<!-- results ")]
    assert opened and all(x.endswith(f"fingerprint={fp} -->") for x in opened), opened
    assert "`None`" not in card and card.count(f"(fingerprint `{fp[:12]}…`)") == len(opened)
    assert "| test | draft-flat |" in card and "flat vs mrope" in card and "| 2 |" in card
    rew = json.loads((root / "metrics.json").read_text())["aarl_reward"]
    assert rew["draft-flat"]["scenes"] == 2 and "action reward" in card
    for r in (rew["draft-flat"], rew["draft-flat-aarl"]):
        assert r["action_reward"] == pytest.approx(-r["ade"] / 2.0 - r["collision"]) and r["reward"] <= 1.0
    got = json.loads((root / "metrics.json").read_text())["splits"]["test"]
    assert set(got["drafts"]) == {"draft-flat", "draft-mrope", "draft-flat-standalone", "draft-flat-aarl"}
    for numbers in got["drafts"].values():
        assert 1.0 <= numbers["tau"] <= 4.0 and 0.0 <= numbers["attn_vision"] <= 1.0
    assert got["ade"]["const_vel"] > 0 and 0.0 <= got["commitment_acc"] <= 1.0
    assert sum(f["scenes"] for f in got["families"].values()) == got["scenes"]
    assert got["commitment_acc"] == pytest.approx(
        sum(f["scenes"] * f["commitment_acc"] for f in got["families"].values()) / got["scenes"])
    assert "by scene family" in card and f"| {sorted(got['families'])[0]} |" in card
    budget = got["budget_action"]["modes"]      # what a budget of P passes lets through, then the expert
    full = budget["full"]["0"]
    assert full["commitment"] == pytest.approx(got["commitment_acc"])   # no cut: the evaluation's own grading
    assert full["ade"] == pytest.approx(got["ade"]["full"], rel=1e-5)    # and the expert's plan after the full CoC
    for p in map(str, got["budget_action"]["passes"]):
        plain = budget["plain"][p]
        assert all(t <= int(p) for t in plain["tokens_scenes"])
        for name in got["drafts"]:
            mode = budget[name][p]
            for i, t in enumerate(mode["tokens_scenes"]):
                assert plain["tokens_scenes"][i] <= t <= full["tokens_scenes"][i], name
                if t == full["tokens_scenes"][i]:         # nothing cut: the plan after the full CoC
                    assert mode["ade_scenes"][i] == pytest.approx(full["ade_scenes"][i])
    for numbers in got["drafts"].values():      # the attention over the three key kinds adds up to 1
        for rec in numbers["per_scene"]:
            assert sum(rec["attn"][k][0] for k in ("history", "vision", "text")) == pytest.approx(1.0, abs=1e-4)
        tau, lo, hi = numbers["intervals"]["tau"]
        assert lo <= tau <= hi and tau == pytest.approx(numbers["tau"])
    assert "## Action quality under a budget" in (root / "claims.md").read_text()
    assert "claims_attention.png" in card and (root / "claims_attention.png").is_file()
    for name, loop in got["runtime_loop"].items():   # the runtime's own loop agrees with the replay
        assert loop["same_reasoning"] == 1.0, name
        assert loop["tau"] == pytest.approx(got["drafts"][name]["tau"]), f"{name}: runtime vs replayed tau"
        assert loop["tau"] == pytest.approx(loop["replay_tau"])
    part = root / "metrics.parts" / "test.json"      # a finished split is kept: a re-run reuses it
    assert json.loads(part.read_text())["split"] == got
    calls = []
    real = evaluate.evaluate_split

    def counted(cfg, split, *a):
        calls.append((split, cfg.k))
        return real(cfg, split, *a)

    monkeypatch.setattr(evaluate, "evaluate_split", counted)
    ecfg.card, ecfg.claims, ecfg.aarl_scenes = "", "", 0
    evaluate.run(ecfg)
    assert calls == [] and json.loads((root / "metrics.json").read_text())["splits"]["test"] == got
    ecfg.k = 2                                        # another setting: the split is computed again
    evaluate.run(ecfg)
    assert calls == [("test", 2)]


def test_eval_scores_a_reduced_head_draft_through_its_map(root):
    """A head over every text token, started from the target head's rows, proposes what the full
    head proposes: the evaluation must read its rows through d2t and score it the same."""
    import numpy as np

    from models.draft import Draft
    from train import ckpt
    from train.config import DataConfig, EvalConfig

    tok, mcfg, target, expert = io.load_planner("checkpoints/tiny")
    _, full, _ = io.load_draft("checkpoints/tiny/draft-flat", mcfg, target)
    text = np.flatnonzero(tok.text_mask())
    reduced = Draft(ckpt.draft_config(mcfg, "flat", len(text)), target.embed_tokens, target.lm_head)
    reduced.load_state_dict(full.state_dict(), strict=False)
    reduced.set_vocab(text)
    assert reduced.vocab_head.weight.shape[0] == len(text) < mcfg.target.llm.vocab_size
    cfg = EvalConfig(planner="checkpoints/tiny", data=DataConfig(dir=str(root / "scenes"), split="test", max_scenes=3),
                     k=4, max_new_tokens=24, batch=3)
    got = evaluate.evaluate_split(cfg, "test", tok, mcfg, target, expert, {"full": full, "reduced": reduced})
    a, b = got["drafts"]["full"], got["drafts"]["reduced"]
    assert a["tau"] > 1.0
    for key in ("tau", "tau_k8", "alpha_routine", "alpha_commitment"):
        assert b[key] == pytest.approx(a[key]), key
