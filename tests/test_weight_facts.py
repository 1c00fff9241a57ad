"""The facts a checkpoint's arithmetic depends on beyond shapes (rotary theta and sections,
the image layout) are checked against the weights, not the card alone (issue 50, 2): setting
rope_theta in every meta.json of a checkpoint copy loaded and planned wrong with exit 0."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models import io
from models.config import load_preset
from models.weight_facts import FACTS_KEY, LEGACY, module_facts
from core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "tiny"


def _edit_all(folder: Path, change) -> None:
    for meta_file in folder.glob("*/meta.json"):
        meta = json.loads(meta_file.read_text())
        change(meta["config"]["target"]["llm"])
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")


def test_the_shipped_weights_are_known_with_the_facts_their_cards_say():
    for d in [p for p in SHIPPED.iterdir() if (p / "meta.json").is_file()]:
        meta = io.read_meta(d)
        for name, entry in meta.modules.items():
            want = LEGACY[entry.sha256]
            have = module_facts(io._build_config(d, meta), name)
            assert {k: have[k] for k in want} == want, (d.name, name)


def test_rope_theta_rewritten_in_every_card_of_the_shipped_checkpoint_exits_2(tmp_path):
    c = tmp_path / "c"
    shutil.copytree(SHIPPED, c)
    _edit_all(c, lambda llm: llm.update(rope_theta=1e4))
    with pytest.raises(ConfigError, match=r"field 'rope_theta' of module 'target' is 10000.0, but its weights "
                                          r"\(target.safetensors\) were made for 5000000.0"):
        io.load_planner(c)
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "plan", "--checkpoint", str(c), "--scenes", "1",
                           "--quiet", "--pictures", "0", "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "'rope_theta'" in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr[-600:]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("field, value", [("rope_theta", 1e4), ("mrope_section", [8, 4, 4]),
                                          ("interleaved", False), ("image_attention", "frame_local")])
def test_a_saved_checkpoint_carries_its_facts_in_the_weights_header(tmp_path, field, value):
    """io.save writes the facts into each module's safetensors header (covered by its sha256):
    the same card edit on a newly saved checkpoint is refused by the header, not by a table."""
    from safetensors import safe_open

    cfg = load_preset("tiny")
    target, expert, _ = io.new_models(cfg, 0)
    folder = io.save(tmp_path / "t", {"target": target}, cfg, {"kind": "target"})
    with safe_open(str(folder / "target.safetensors"), "pt") as f:
        assert json.loads(f.metadata()[FACTS_KEY]) == module_facts(cfg, "target")
    io.load(folder, kind="target")                                   # as saved: loads
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["config"]["target"]["llm"][field] != value
    meta["config"]["target"]["llm"][field] = value
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=f"field '{field}' of module 'target' is"):
        io.load(folder, kind="target")
