"""Vision pretraining (train/vision.py) and the commitment metric's grammar variants: the probe
learns on a handful of scenes, SFT starts its tower from the saved weights, a tower of another
preset or a missing file is refused with a message that says what to do."""
import json

import numpy as np
import pytest
import safetensors.torch
import torch
import yaml

from core.config import ConfigError, from_dict
from train import config, data, metrics, sft, vision
from train_inputs import stage_root

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return stage_root(tmp_path_factory.mktemp("vision"), seed=1)


def _vision_cfg(root, out, steps, **extra):
    body = {"preset": str(root / "micro.yaml"), "data": {"dir": str(root / "scenes"), "max_scenes": 8},
            "val_scenes": 2, **extra,
            "run": {"out": str(root / out), "steps": steps, "batch_size": 8, "warmup": 1, "lr": 3e-3,
                    "ckpt_every_s": 0, "log_every": 1, "threads": 0, "min_lr_ratio": 1.0}}
    path = root / f"{out}.yaml"
    path.write_text(yaml.safe_dump(body))
    return config.load("vision", path)


def test_the_probe_fits_a_handful_of_scenes_and_writes_the_tower(root):
    weights = vision.run(_vision_cfg(root, "vis", steps=25))
    rows = [json.loads(r) for r in (root / "vis" / "log.jsonl").read_text().splitlines()]
    assert rows[-1]["bce"] < rows[0]["bce"] * 0.5 and rows[-1]["ce"] < rows[0]["ce"] * 0.5
    val = json.loads((root / "vis" / "val.json").read_text())
    assert val["scenes"] == 2 and 0.0 <= val["decision"] <= 1.0 and val["families"]
    meta = safetensors.safe_open(str(weights), "pt").metadata()
    assert meta["stage"] == "vision" and "the" in json.loads(meta["cause_words"])


def test_sft_starts_its_tower_from_the_pretrained_weights(root):
    weights = root / "vis" / "vision.safetensors"
    if not weights.is_file():
        vision.run(_vision_cfg(root, "vis", steps=2))
    tok = sft.run_tokenizer(root / "tok", sft.dist.World(0, 1))
    _, target, _ = sft.build_models(str(root / "micro.yaml"), tok, seed=5)
    saved = safetensors.torch.load_file(str(weights))
    assert any(not torch.equal(target.visual.state_dict()[k], v) for k, v in saved.items())
    vision.load_into_target(target, weights)
    for k, v in saved.items():
        assert torch.equal(target.visual.state_dict()[k], v), k


def test_a_tower_of_another_preset_or_a_missing_file_is_refused(root, tmp_path):
    weights = root / "vis" / "vision.safetensors"
    if not weights.is_file():
        vision.run(_vision_cfg(root, "vis", steps=2))
    tok = sft.run_tokenizer(root / "tok", sft.dist.World(0, 1))
    _, tiny, _ = sft.build_models("tiny", tok, seed=0)
    with pytest.raises(ConfigError, match="missing .*blocks.1.* another preset"):
        vision.load_into_target(tiny, weights)
    _, micro, _ = sft.build_models(str(root / "micro.yaml"), tok, seed=0)
    bent = safetensors.torch.load_file(str(weights))
    bent["patch_embed.proj.weight"] = bent["patch_embed.proj.weight"][:, :-1].contiguous()
    safetensors.torch.save_file(bent, str(tmp_path / "bent.safetensors"))
    with pytest.raises(ConfigError, match="patch_embed.proj.weight has shape .* needs"):
        vision.load_into_target(micro, tmp_path / "bent.safetensors")
    with pytest.raises(ConfigError, match="train vision"):
        vision.load_into_target(micro, tmp_path / "nothing.safetensors")


class _Scene:
    def __init__(self, family, kind, facts, decision):
        self.family, self.cause_kind, self.cause_facts, self.decision = family, kind, facts, decision


ROUTINE = "ego is driving at 9.2 m/s , holding a steady speed , going straight , covering 12.0 m ,"


def test_the_commitment_metric_reads_any_paraphrase_of_the_same_facts():
    scene = _Scene("follow", "follow", {"noun": "van"}, "follow")
    said = lambda text: (ROUTINE + " " + text).split()   # noqa: E731
    assert metrics.commitment_correct(said("a van is 12.5 m ahead , so follow it"), scene) == (True, True)
    assert metrics.commitment_correct(said("a van leads 3.0 m ahead , so keep the gap"), scene) == (True, True)
    assert metrics.commitment_correct(said("a car leads 3.0 m ahead , so keep the gap"), scene) == (False, True)
    assert metrics.commitment_correct(said("a van is 12.5 m ahead , so slow down"), scene) == (True, False)
    light = _Scene("traffic_light", "light", {"light": "yellow"}, "slow_down")
    assert metrics.commitment_correct(said("the signal ahead shows yellow , so ease off"), light) == (True, True)
    assert metrics.commitment_correct(said("the traffic light ahead is red , so slow down"), light) == (False, True)


def test_vision_labels_are_the_cause_words_and_the_decision():
    from scenes.config import DECISIONS

    scenes = [_Scene("turn", "turn", {"side": "left"}, "turn_left")]
    assert vision.cause_words(scenes[0]) == "the road turns left ahead".split()
    index = {w: i for i, w in enumerate(["ahead", "left", "right", "road", "the", "turns"])}
    hot, dec = vision.labels(scenes, index, DECISIONS)
    assert hot.tolist() == [[1, 1, 0, 1, 1, 1]] and DECISIONS[int(dec[0])] == "turn_left"
    assert np.asarray(hot).dtype == np.float32


def test_the_fact_key_keeps_the_facts_and_ignores_nothing_else():
    key = lambda fam, kind, facts, dec: data.fact_key(_Scene(fam, kind, facts, dec))  # noqa: E731
    assert key("follow", "follow", {"noun": "van"}, "follow") == key("follow", "follow", {"noun": "van"}, "follow")
    assert key("follow", "follow", {"noun": "van"}, "follow") != key("follow", "follow", {"noun": "car"}, "follow")
    yellow = key("traffic_light", "light", {"light": "yellow"}, "slow_down")
    assert yellow != key("traffic_light", "light", {"light": "red"}, "slow_down")
    assert yellow != key("traffic_light", "light", {"light": "yellow"}, "stop")
    assert yellow != key("lead_braking", "light", {"light": "yellow"}, "slow_down")


def test_balanced_batches_draw_rare_facts_more_and_split_across_ranks():
    keys = ["common"] * 90 + ["rare"] * 10
    assert data.balance_weights(keys, 0.0) is None
    full = data.balance_weights(keys, 1.0)
    assert full[:90].sum() == pytest.approx(0.5) and full[90:].sum() == pytest.approx(0.5)
    half = data.balance_weights(keys, 0.5)
    assert 0.1 < half[90:].sum() < 0.5
    drawn = np.concatenate([data.batch_indices(100, 50, s, seed=3, weights=full) for s in range(40)])
    assert 0.4 < np.mean(drawn >= 90) < 0.6          # 2000 draws; uniform epochs would give 0.1
    one = data.batch_indices(100, 8, 5, seed=3, weights=full)
    two = [data.batch_indices(100, 4, 5, seed=3, rank=r, world=2, weights=full) for r in range(2)]
    assert list(two[0]) + list(two[1]) == list(one)
    assert list(data.batch_indices(100, 8, 5, seed=3, weights=full)) == list(one)
    with pytest.raises(ValueError, match="3 sampling weights for 100 items"):
        data.batch_indices(100, 8, 0, seed=3, weights=np.ones(3) / 3)


def test_balance_is_refused_out_of_range_and_where_it_does_not_apply():
    with pytest.raises(ConfigError, match=r"data.balance=1.5 is out of range; allowed \[0.0, 1.0\]"):
        config.DataConfig(balance=1.5)
    for stage in (config.DistillConfig, config.AARLConfig):
        with pytest.raises(ConfigError, match="balance applies to the vision and sft stages only"):
            from_dict(stage, {"data": {"balance": 0.5}})
    assert from_dict(config.SFTConfig, {"data": {"balance": 0.5}}).data.balance == 0.5
