"""`specdrive plan`: runs cycles, writes one JSON line per cycle (failures included), a
summary and SVG pictures; bad arguments and artifacts exit with status 2 and a clear message."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def specdrive(*args):
    return subprocess.run([sys.executable, "-m", "tools.cli", "plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_plan_on_synthetic_scenes_with_random_weights(tmp_path):
    pytest.importorskip("scenes.world")
    out = tmp_path / "run"
    r = specdrive("--preset", "tiny", "--random-init", "0", "--scenes", "3", "--max-reasoning", "6",
                  "--budget-ms", "0", "--pictures", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (out / "cycles.jsonl").read_text().splitlines()]
    assert [x["cycle"] for x in lines] == [1, 2, 3]
    assert all(len(x["trajectory"]) == 64 and len(x["expert"]) == 64 for x in lines)
    assert json.loads((out / "summary.json").read_text())["cycles"] == 3
    svgs = sorted(out.glob("cycle_*.svg"))
    assert len(svgs) == 2 and ET.parse(svgs[0]).getroot().tag.endswith("svg")
    assert "reasoning" in r.stdout.splitlines()[0]           # the live table's header


def test_plan_with_the_torch_reference_backend(tmp_path):
    pytest.importorskip("scenes.world")
    out = tmp_path / "run"
    r = specdrive("--preset", "tiny", "--random-init", "0", "--scenes", "1", "--max-reasoning", "6",
                  "--warmup", "0", "--budget-ms", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    line = json.loads((out / "cycles.jsonl").read_text())
    assert line["trajectory"] is not None and line["source"] in ("reasoning", "prefill", "stop")


@pytest.mark.parametrize("args,message", [
    (["--preset", "tiny"], "--random-init"),
    (["--preset", "tiny", "--random-init", "0", "--backend", "onnxruntime"], "--engines DIR"),
    (["--preset", "tiny", "--random-init", "0", "--k", "99"], "spec.k=99"),
    (["--preset", "tiny", "--random-init", "0", "--profile", "nope"], "known profiles"),
    (["--checkpoint", "{tmp}"], "no tokenizer.json"),
    (["--engines", "{tmp}"], "no meta.json"),
])
def test_bad_arguments_exit_2_with_the_reason(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = specdrive(*args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_an_artifact_is_what_its_meta_json_says(tmp_path):
    from core.config import ConfigError
    from runtime.artifacts import find_checkpoints

    (tmp_path / "weird_name").mkdir()
    (tmp_path / "weird_name" / "meta.json").write_text(json.dumps({"format": "specdrive-checkpoint", "kind": "target"}))
    (tmp_path / "target").mkdir()                                  # a folder name means nothing
    (tmp_path / "target" / "meta.json").write_text(json.dumps({"format": "specdrive-checkpoint", "kind": "expert"}))
    assert find_checkpoints(tmp_path) == {"target": tmp_path / "weird_name", "expert": tmp_path / "target"}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "meta.json").write_text(json.dumps({"format": "onnx", "kind": "target"}))
    with pytest.raises(ConfigError, match="not a specdrive model checkpoint"):
        find_checkpoints(tmp_path)


def test_a_folder_with_several_drafts_runs_the_named_one_or_flat(tmp_path):
    from core.config import ConfigError
    from runtime.artifacts import find_checkpoints

    def meta(folder, **fields):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "meta.json").write_text(json.dumps({"format": "specdrive-checkpoint", **fields}))

    meta("t", kind="target")
    meta("e", kind="expert")
    meta("d1", kind="draft", variant="mrope")
    meta("d2", kind="draft", variant="flat")
    assert find_checkpoints(tmp_path)["draft"] == tmp_path / "d2"            # the default variant
    assert find_checkpoints(tmp_path, "mrope")["draft"] == tmp_path / "d1"
    assert "draft" not in find_checkpoints(tmp_path, "none")
    with pytest.raises(ConfigError, match=r"has the drafts \['flat', 'mrope'\]"):
        find_checkpoints(tmp_path, "eagle")
    meta("d3", kind="draft", variant="flat")
    with pytest.raises(ConfigError, match="two checkpoints of kind 'draft' named 'flat'"):
        find_checkpoints(tmp_path)
