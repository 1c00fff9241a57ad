"""A draft predicts the target weights it was trained against: its meta.json records their sha256
(target_sha256, train/ckpt.py). Issue 50, 3: a draft recorded for another target was exported
(onnx, edgellm) and loaded with exit 0; every loader and exporter now refuses it, naming both
hashes."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from folders import planner_copy
from models import io
from core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "checkpoints" / "tiny"
OTHER = "0123456789abcdef" * 4          # the sha256 of weights that are not the target's


def _retarget(planner: Path) -> str:
    """Record OTHER as the target every draft of `planner` was trained for; -> the target's sha256."""
    for meta_file in planner.glob("draft-*/meta.json"):
        meta = json.loads(meta_file.read_text())
        meta["target_sha256"] = OTHER
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    return io.target_sha256(io.scan_checkpoints(planner)[0])


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    planner = tmp_path_factory.mktemp("stale") / "p"
    shutil.copytree(SHIPPED, planner)
    return planner, _retarget(planner)


def _names_both(err: str, sha: str) -> bool:
    return OTHER in err and sha in err


def test_plan_refuses_a_draft_trained_for_another_target(stale, tmp_path):
    planner, sha = stale
    for draft in ([], ["--draft", "flat-v256"], ["--draft", str(planner / "draft-mrope")]):
        proc = subprocess.run([sys.executable, "-m", "tools.cli", "plan", "--checkpoint", str(planner), *draft,
                               "--scenes", "1", "--quiet", "--pictures", "0", "--out", str(tmp_path / "o")],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2 and _names_both(proc.stderr, sha), proc.stderr[-800:]
        assert "Traceback" not in proc.stderr
    shutil.copytree(planner / "draft-flat", tmp_path / "d")           # a draft given by path, outside
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "plan", "--checkpoint", str(SHIPPED), "--draft",
                           str(tmp_path / "d"), "--scenes", "1", "--quiet", "--pictures", "0",
                           "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and _names_both(proc.stderr, sha), proc.stderr[-800:]


def test_the_onnx_exporter_refuses_it_and_writes_nothing(stale, tmp_path):
    from export import onnx as ex

    planner, sha = stale
    with pytest.raises(ConfigError) as e:
        ex.export_onnx(planner, tmp_path / "out", None, ex.ExportConfig(), progress=lambda *_: None)
    assert _names_both(str(e.value), sha), e.value
    assert not (tmp_path / "out").exists()


def test_the_edgellm_exporter_refuses_it_and_writes_nothing(tmp_path):
    from export.edgellm import export_edgellm

    planner = planner_copy(SHIPPED, tmp_path / "causal", "causal")      # the layout Edge-LLM takes
    sha = _retarget(planner)
    with pytest.raises(ConfigError) as e:
        export_edgellm(planner, tmp_path / "out", "eagle3-v256", progress=lambda *_: None)
    assert _names_both(str(e.value), sha), e.value
    assert not (tmp_path / "out").exists()


def test_the_shipped_drafts_record_the_shipped_target():
    models, drafts = io.scan_checkpoints(SHIPPED)
    sha = io.target_sha256(models)
    for folder in drafts.values():
        io.check_trained_for(folder, io.read_meta(folder), sha)        # raises when one differs
    assert {io.read_meta(f).extra["target_sha256"] for f in drafts.values()} == {sha}
