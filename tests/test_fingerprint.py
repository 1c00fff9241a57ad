"""A folder's fingerprint (core/artifacts.py folder_fingerprint): a sha256 over its cards and
every file they name, printed at start by plan / bench / drive and pinnable (--expect-fingerprint,
the planner profile's `fingerprint`, --expect-drives-fingerprint), so a folder rewritten with its
hashes recomputed (what the facts hash cannot tell) is refused with exit 2."""
import json
import shutil
from pathlib import Path

import pytest

from core.artifacts import folder_fingerprint, pinned_fingerprint, stamp_facts
from core.config import ConfigError
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp") / "tiny"
    shutil.copytree(ROOT / "checkpoints" / "tiny", out)
    return out


def test_the_fingerprint_covers_every_card_and_every_file_they_name(tiny, tmp_path):
    c = tmp_path / "c"
    shutil.copytree(tiny, c)
    fp = folder_fingerprint(c)
    assert fp == folder_fingerprint(tiny) and len(fp) == 64
    (c / "notes.md").write_text("not read by the planner")            # named by no card: not covered
    assert folder_fingerprint(c) == fp
    meta = json.loads((c / "target" / "meta.json").read_text())
    weights = c / "target" / next(m["file"] for m in meta["modules"].values())
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                                     # one bit of one weight
    weights.write_bytes(bytes(data))
    assert folder_fingerprint(c) != fp
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert folder_fingerprint(c) == fp
    (c / "target" / "meta.json").write_text(json.dumps(meta))         # the same facts, other bytes
    assert folder_fingerprint(c) != fp
    tok = json.loads((c / "tokenizer.json").read_text())
    (c / "tokenizer.json").write_text(json.dumps(tok) + " ")
    assert folder_fingerprint(c) != folder_fingerprint(tiny)
    for name, says in (("../../outside.bin", "outside the folder"), ("nothing.bin", "which is missing")):
        (tmp_path / "outside.bin").write_bytes(b"x")
        meta2 = {**meta, "modules": {"x": {"file": name}}}
        (c / "expert" / "meta.json").write_text(json.dumps(meta2))
        with pytest.raises(ConfigError, match=says):
            folder_fingerprint(c)


def test_a_pin_is_64_hex_digits_and_a_folder_that_differs_is_refused(tiny, tmp_path):
    fp = folder_fingerprint(tiny)
    assert pinned_fingerprint(tiny, ("--expect-fingerprint", fp)) == fp
    other = fp[:-1] + ("0" if fp[-1] != "0" else "1")
    with pytest.raises(ConfigError, match=f"has the fingerprint {fp}, not the {other} pinned by --expect-fingerprint"):
        pinned_fingerprint(tiny, ("--expect-fingerprint", other))
    for bad in (fp[:12], fp.upper(), "x" * 64):
        with pytest.raises(ConfigError, match="allowed 64 lowercase hex digits"):
            ModelSource(checkpoint=tiny, expect_fingerprint=bad)
        with pytest.raises(ConfigError, match="fingerprint=.* is not a fingerprint"):
            PlannerConfig(fingerprint=bad)
    with pytest.raises(ConfigError, match="--preset models have no folder"):
        ModelSource(preset="micro", random_init=0, expect_fingerprint=fp)
    with pytest.raises(ConfigError, match="pinned by --expect-fingerprint"):
        open_backend(ModelSource(checkpoint=tiny, expect_fingerprint=other), 512)


def test_a_drives_folder_rewritten_with_its_hashes_recomputed_has_another_fingerprint(tmp_path):
    from safetensors.numpy import load_file, save_file
    from scenes.dataset import DriveConfig, file_sha256, generate_drives, load_drives

    d = tmp_path / "d"
    generate_drives(DriveConfig(str(d), 1, 0.3, 0, "test"), progress=False)
    fp = folder_fingerprint(d)
    shard = d / "test" / "drive-00000.safetensors"
    arrays = load_file(str(shard))
    arrays["images"] = 255 - arrays["images"]                          # every pixel inverted
    save_file(arrays, str(shard), metadata={"format": "specdrive-drives-v2"})
    m = json.loads((d / "manifest.json").read_text())
    m["splits"]["test"]["drives"][0]["sha256"]["safetensors"] = file_sha256(shard)
    (d / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    load_drives(d, "test").check()                                     # consistent: the shard check passes
    with pytest.raises(ConfigError, match="pinned by --expect-drives-fingerprint"):
        pinned_fingerprint(d, ("--expect-drives-fingerprint", fp), what="drives folder")


def _plan(args, capsys):
    from tools.cli import main
    try:
        code = main(["plan", *args, "--scenes", "1", "--quiet", "--pictures", "0", "--warmup", "0"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_restamped_engines_meta_is_refused_unpinned_by_its_graphs_and_pinned_by_its_fingerprint(
        tiny_onnx, tmp_path, capsys):
    """rope_theta edited and facts_sha256 recomputed with the project's own helper: the facts
    hash cannot tell, but each graph carries the rotary facts it was exported for (metadata
    "specdrive.rope"), so even unpinned the folder is refused naming the field; pinned by
    --expect-fingerprint or by the planner profile it exits 2 before any cycle, and `plan`
    prints the fingerprint at start."""
    e = tmp_path / "e"
    shutil.copytree(tiny_onnx, e)
    fp = folder_fingerprint(e)
    code, out, err = _plan(["--engines", str(e), "--expect-fingerprint", fp, "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err
    assert f"fingerprint {e}: {fp} (pinned)" in out.splitlines()[0]
    meta = json.loads((e / "meta.json").read_text())
    meta["target"]["rope_theta"] = 1e4
    (e / "meta.json").write_text(json.dumps(stamp_facts(meta)))
    with pytest.raises(ConfigError, match=r"'target.rope_theta' = 10000.0, but graph .* was exported for 5000000.0"):
        open_backend(ModelSource(engines=e), 512)                      # unpinned: the graphs tell
    assert folder_fingerprint(e) != fp
    code, out, err = _plan(["--engines", str(e), "--expect-fingerprint", fp, "--out", str(tmp_path / "o1")], capsys)
    assert code == 2 and f"not the {fp} pinned by --expect-fingerprint" in err, err
    assert not (tmp_path / "o1").exists()
    profile = tmp_path / "pinned.yaml"
    profile.write_text((ROOT / "configs" / "planner" / "cpu.yaml").read_text() + f"\nfingerprint: {fp}\n")
    code, out, err = _plan(["--engines", str(e), "--profile", str(profile), "--out", str(tmp_path / "o2")], capsys)
    assert code == 2 and f"not the {fp} pinned by the planner profile's fingerprint" in err, err


def _plant_release(folder):
    """An Alpamayo-R1 release layout of other (random) weights at the root of `folder`:
    config.json (model_type alpamayo_r1), sharded safetensors and their index."""
    import torch
    from models.action_expert import ActionExpert
    from models.alpamayo import save_alpamayo
    from models.config import load_preset
    from models.target import Target

    cfg = load_preset("tiny")
    torch.manual_seed(1)
    save_alpamayo(folder, Target(cfg.target), ActionExpert(cfg.expert, cfg.target.llm), cfg,
                  vlm_name_or_path="other", shard_bytes=2_000_000)


def test_a_checkpoint_folder_with_a_release_planted_at_its_root_is_refused(tiny, tmp_path, capsys):
    """Issue 50, 1: a copy of the checkpoint with a release layout of other weights added at its
    root chose the release loader (by the root's files) while the fingerprint, over the cards,
    stayed the checkpoint's: pinned, it ran the other weights. A folder of two kinds is refused,
    pinned or not, before any cycle."""
    fp = folder_fingerprint(tiny)
    c = tmp_path / "c"
    shutil.copytree(tiny, c)
    _plant_release(c)
    assert json.loads((c / "config.json").read_text())["model_type"] == "alpamayo_r1"
    with pytest.raises(ConfigError, match="two kinds at once.*Allowed: one kind per folder"):
        folder_fingerprint(c)
    for pin in (["--expect-fingerprint", fp], []):
        code, out, err = _plan(["--checkpoint", str(c), "--draft", "none", *pin, "--out", str(tmp_path / "o")],
                               capsys)
        assert code == 2 and "two kinds at once" in err and "(pinned)" not in out, (code, out, err)
        assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="two kinds at once"):
        open_backend(ModelSource(checkpoint=c, draft="none"), 512)


def test_a_tokenizer_linked_out_of_the_folder_exits_2(tiny, tmp_path, capsys):
    """Issue 50, 4: a tokenizer.json symlinked to a file outside the folder was a ValueError
    (exit 1) in the fingerprint; it is refused like a card naming a file outside (exit 2)."""
    c = tmp_path / "c"
    shutil.copytree(tiny, c)
    outside = tmp_path / "tokenizer-elsewhere.json"
    (c / "tokenizer.json").rename(outside)
    (c / "tokenizer.json").symlink_to(outside)
    with pytest.raises(ConfigError, match="links outside .* copy the file into the folder"):
        folder_fingerprint(c)
    code, out, err = _plan(["--checkpoint", str(c), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "links outside" in err and "Traceback" not in err, (code, err)


def test_an_export_whose_graphs_lost_their_rope_metadata_is_refused_unpinned(tiny_onnx, tmp_path):
    """Issue 50, 2: graphs with their 'specdrive.rope' metadata stripped (hashes redone) and
    rope_theta restamped ran unpinned with other reasoning; a graph of this format version without
    it is refused."""
    import onnx
    from core.config import file_sha256

    e = tmp_path / "e"
    shutil.copytree(tiny_onnx, e)
    meta = json.loads((tiny_onnx / "meta.json").read_text())
    meta["target"]["rope_theta"] = 1e4
    for name, g in meta["graphs"].items():
        model = onnx.load(str(e / g["file"]), load_external_data=False)
        kept = [p for p in model.metadata_props if p.key != "specdrive.rope"]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        onnx.save(model, str(e / g["file"]))
        g["sha256"] = file_sha256(e / g["file"])
    (e / "meta.json").write_text(json.dumps(stamp_facts(meta)))
    with pytest.raises(ConfigError, match=r"no 'specdrive.rope' metadata, which every graph of an ONNX export of "
                                          r"format version 1 carries.*re-export the folder"):
        open_backend(ModelSource(engines=e), 512)


def test_an_unpinned_vehicle_run_says_once_it_is_unverified_and_require_pin_refuses_it(tiny_onnx, tmp_path, capsys):
    """Issue 50, 2: unpinned, nothing said the folder was unverified. plan --engines and drive
    say it once, naming the fingerprint to pin; a profile with require_pin: true exits 2; pinned,
    nothing is said; plan --checkpoint (a development path) says nothing."""
    from tools.cli import main

    fp = folder_fingerprint(tiny_onnx)
    code, out, err = _plan(["--engines", str(tiny_onnx), "--out", str(tmp_path / "a")], capsys)
    assert code == 0 and err.count("is unverified") == 1 and f"--expect-fingerprint {fp}" in err, err
    code, out, err = _plan(["--engines", str(tiny_onnx), "--expect-fingerprint", fp, "--out", str(tmp_path / "b")],
                           capsys)
    assert code == 0 and "unverified" not in err, err
    code, out, err = _plan(["--checkpoint", str(ROOT / "checkpoints" / "tiny"), "--out", str(tmp_path / "c")], capsys)
    assert code == 0 and "unverified" not in err, err
    strict = tmp_path / "strict.yaml"
    strict.write_text((ROOT / "configs" / "planner" / "cpu.yaml").read_text() + "\nrequire_pin: true\n")
    code, out, err = _plan(["--engines", str(tiny_onnx), "--profile", str(strict), "--out", str(tmp_path / "d")],
                           capsys)
    assert code == 2 and "require_pin: true" in err and f"--expect-fingerprint {fp}" in err, err
    assert not (tmp_path / "d").exists()
    with pytest.raises(SystemExit) as e:
        main(["drive", "--drives", "1", "--seconds", "0.1", "--profile", str(strict), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is unverified" in err and "require_pin: true" in err, err
    assert main(["drive", "--drives", "1", "--seconds", "0.1", "--modes", "plain", "--gifs", "0", "--quiet",
                 "--out", str(tmp_path / "f")]) == 0
    assert capsys.readouterr().err.count("is unverified") == 1
