"""`specdrive train ship` with reduced-head draft variants ("<variant>-v<N>"): shipped from the
checked-in planner's folders into a temporary one, and the names and heads it refuses."""
import json
import shutil

import pytest
import yaml

from models import io
from core.config import ConfigError
from train import config, ship
from train.config import ShipConfig, ship_vocab

TINY = "checkpoints/tiny"


def _cfg(tmp_path, body: dict) -> ShipConfig:
    path = tmp_path / f"ship-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(body))
    return config.load("ship", path)


def test_draft_names_with_a_reduced_head():
    assert ship_vocab("flat") == 0 and ship_vocab("flat-aarl") == 0
    assert ship_vocab("flat-v256") == 256 and ship_vocab("mrope-standalone-v8") == 8
    for bad in ("flat-v0", "flat-v", "flat-v08", "flat-vx", "flat-aarl-v256", "wide-v256", "flat-v256-v8"):
        assert ship_vocab(bad) is None, bad
    with pytest.raises(ConfigError, match="flat-v0.*<variant>-v<N>"):
        ShipConfig(drafts={"flat-v0": "x"})
    assert "flat-v256" in ShipConfig().drafts                  # the default ships the reduced head too
    assert ShipConfig().drafts["eagle3-v256"].endswith("draft-eagle3-v256")   # and the EAGLE-3 draft


def test_ship_copies_a_reduced_head_draft_and_refuses_a_mislabelled_one(tmp_path):
    out = tmp_path / "shipped"
    shipped = ship.run(_cfg(tmp_path, {"sft": TINY, "out": str(out), "drafts": {
        "flat": f"{TINY}/draft-flat", "flat-v256": f"{TINY}/draft-flat-v256",
        "eagle3-v256": f"{TINY}/draft-eagle3-v256"}}))
    _, cfg, meta = io.load(f"{shipped}/draft-flat-v256")
    assert cfg.draft.vocab == 256 and meta.draft_vocab == 256 and meta.variant == "flat-v256"
    _, cfg, meta = io.load(f"{shipped}/draft-eagle3-v256")
    assert cfg.draft.arch == "eagle3" and cfg.draft.feature_layers == (1, 5, 8) and meta.draft_vocab == 256
    assert sorted(p.name for p in out.iterdir()) == ["draft-eagle3-v256", "draft-flat", "draft-flat-v256",
                                                     "expert", "target", "tokenizer.json"]
    # a full-head draft under a -v<N> name, and a reduced head whose meta.json claims another N
    with pytest.raises(ConfigError, match="variant"):
        ship.run(_cfg(tmp_path, {"sft": TINY, "out": str(tmp_path / "bad"),
                                 "drafts": {"flat-v256": f"{TINY}/draft-flat"}}))
    forged = tmp_path / "draft-flat-v128"
    shutil.copytree(f"{TINY}/draft-flat-v256", forged)
    meta = json.loads((forged / "meta.json").read_text())
    (forged / "meta.json").write_text(json.dumps({**meta, "variant": "flat-v128"}))
    with pytest.raises(ConfigError, match="needs 128"):
        ship.run(_cfg(tmp_path, {"sft": TINY, "out": str(tmp_path / "bad2"), "drafts": {"flat-v128": str(forged)}}))


def test_ship_refuses_a_draft_trained_against_other_target_weights_and_writes_nothing(tmp_path):
    stale = tmp_path / "draft-flat"
    shutil.copytree(f"{TINY}/draft-flat", stale)
    meta = json.loads((stale / "meta.json").read_text())
    (stale / "meta.json").write_text(json.dumps({**meta, "target_sha256": "0" * 64}))
    out = tmp_path / "shipped"
    with pytest.raises(ConfigError, match="trained against target weights 000000000000.*re-distill"):
        ship.run(_cfg(tmp_path, {"sft": TINY, "out": str(out), "drafts": {"flat": str(stale)}}))
    assert not out.exists()                     # checked before anything is copied
    (stale / "meta.json").write_text(json.dumps({**meta, "target_sha256": ship.target_sha256(TINY)}))
    ship.run(_cfg(tmp_path, {"sft": TINY, "out": str(out), "drafts": {"flat": str(stale)}}))
    assert io.read_meta(out / "draft-flat").extra["target_sha256"] == ship.target_sha256(TINY)


def test_a_draft_is_current_only_for_the_target_weights_it_records(tmp_path):
    """configs/train/claims.sh re-trains what `python -m train.current DRAFT TARGET` calls stale."""
    from train.current import main, trained_for

    assert trained_for(f"{TINY}/draft-flat", TINY) and main([f"{TINY}/draft-flat", TINY]) == 0
    old = tmp_path / "draft-flat"
    shutil.copytree(f"{TINY}/draft-flat", old)
    meta = json.loads((old / "meta.json").read_text())
    meta.pop("target_sha256")                       # a draft from before the record
    (old / "meta.json").write_text(json.dumps(meta))
    assert not trained_for(old, TINY) and main([str(old), TINY]) == 1
    assert not trained_for(tmp_path / "nowhere", TINY)
