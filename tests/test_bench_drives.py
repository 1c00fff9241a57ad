"""`specdrive bench --drives` end to end on micro random-weight models and a one-drive folder made
here: every mode on every cycle, the record carries what the issue asks per mode, reasoning
equals plain decoding on every cycle, reuse reuses; a truncated shard or a folder of another
world version exits 2 with a message naming it."""
import json
import shutil

import pytest

from scenes.dataset import DriveConfig, generate_drives
from tools import bench

CYCLES = 6


@pytest.fixture(scope="module")
def drives(tmp_path_factory):
    out = tmp_path_factory.mktemp("drives") / "d"
    generate_drives(DriveConfig(out=str(out), drives=1, seconds=CYCLES * 0.1, split="test"), progress=False)
    return out


def args(preset, drives, out):  # noqa: F811
    return ["--preset", str(preset), "--random-init", "0", "--drafts", "self", "--drives", str(drives),
            "--drive-count", "1", "--cycles", str(CYCLES), "--warmup", "0", "--max-reasoning", "6",
            "--json", str(out)]


def test_bench_drives_runs_every_mode_and_checks_every_cycle(preset, drives, tmp_path):  # noqa: F811
    out = tmp_path / "drives.json"
    assert bench.main(args(preset, drives, out)) == 0
    rec = json.loads(out.read_text())
    names = [m["name"] for m in rec["modes"]]
    assert names == ["plain", "plain+vision", "spec", "spec+vision", "spec+vision+lookup"]
    for m in rec["modes"]:
        assert m["cycles"] == CYCLES and m["errors"] == 0
        assert m["identical"]["equal"] == CYCLES, f"{m['name']}: reasoning differs from plain {m['identical']}"
        assert m["trajectory_max_diff_m"] == 0.0
        for key in ("cycle_ms", "vision_ms", "cycle_speedup_p50", "tau", "lookup_proposed", "model_proposed",
                    "vision_cut"):
            assert m[key] is not None, (m["name"], key)
    by = {m["name"]: m for m in rec["modes"]}
    assert by["spec+vision"]["frames_reused_per_cycle"] == pytest.approx(4 * (CYCLES - 5) / CYCLES, abs=1e-3)
    assert by["spec"]["frames_reused_per_cycle"] == 0 and by["spec"]["lookup_proposed"] == 0
    assert by["plain"]["model_proposed"] == 0 and by["spec"]["model_proposed"] > 0
    # alpha per token class: plain judges nothing; the self draft (the target itself) is always accepted
    assert by["plain"]["alpha_routine"] is None and by["plain"]["alpha_commitment"] is None
    judged = {c: sum(r["judged"][c][1] for r in rec["cycles"] if r["mode"] == "spec") for c in ("routine", "commitment")}
    assert sum(judged.values()) > 0
    for c, n in judged.items():
        assert by["spec"][f"alpha_{c}"] == (1.0 if n else None), (c, n, by["spec"])
    # the per-phase split partitions the cycles by their label, and each part's alpha is its own rows'
    spec_rows = [r for r in rec["cycles"] if r["mode"] == "spec"]
    phases = by["spec"]["alpha_by_phase"]
    assert sum(a["cycles"] for a in phases.values()) == CYCLES
    for ph, a in phases.items():
        rows = [r for r in spec_rows if r["phase"] == ph]
        assert a["cycles"] == len(rows) > 0
        for c in ("routine", "commitment"):
            n = sum(r["judged"][c][1] for r in rows)
            assert a[f"alpha_{c}"] == (1.0 if n else None), (ph, c, a)
    fams = by["spec"]["alpha_by_family"]
    assert sum(a["cycles"] for a in fams.values()) == CYCLES and set(fams) == {r["family"] for r in spec_rows}
    assert set(rec["goal"]) >= {"speedup", "vision_cut", "identical_every_cycle", "tau_lookup_over_model", "met"}
    assert len(rec["cycles"]) == 5 * CYCLES
    assert out.with_suffix(".md").is_file()


@pytest.mark.parametrize("damage,word", [("truncate", "differs from the manifest"), ("version", "world version")])
def test_a_bad_drive_folder_exits_2_naming_it(preset, drives, tmp_path, capsys, damage, word):  # noqa: F811
    bad = tmp_path / "bad"
    shutil.copytree(drives, bad)
    if damage == "truncate":
        shard = next(bad.glob("test/*.safetensors"))
        shard.write_bytes(shard.read_bytes()[:1000])
    else:
        manifest = json.loads((bad / "manifest.json").read_text())
        manifest["format"] = "specdrive-drives-v1"
        (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as e:
        bench.main(args(preset, bad, tmp_path / "x.json"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert word in err and str(bad) in err, err


def test_modes_picks_the_modes_and_keeps_plain(preset, drives, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "spec.json"
    assert bench.main(args(preset, drives, out) + ["--modes", "spec"]) == 0
    rec = json.loads(out.read_text())
    assert [m["name"] for m in rec["modes"]] == ["plain", "spec"]
    assert rec["goal"]["tau_lookup_over_model"] is None and rec["goal"]["met"] is False
    with pytest.raises(SystemExit) as e:
        bench.main(args(preset, drives, tmp_path / "x.json") + ["--modes", "spec,warp"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "warp" in err and "spec+vision+lookup" in err, err


def test_the_tree_mode_runs_trees_on_every_cycle_with_plain_decodings_text(preset, drives, tmp_path, capsys):  # noqa: F811
    """spec+tree (--trees' first shape, the adaptive tree-or-chain choice): every cycle's reasoning
    equals plain decoding's, tree steps ran, alpha by class is reported (the self draft: 1 where
    judged); asked for without --trees it exits 2 naming the flag."""
    out = tmp_path / "tree.json"
    assert bench.main(args(preset, drives, out) + ["--modes", "spec,spec+tree", "--trees", "6,3,2;8,4,2"]) == 0
    rec = json.loads(out.read_text())
    by = {m["name"]: m for m in rec["modes"]}
    assert list(by) == ["plain", "spec", "spec+tree"] and rec["config"]["tree"] == "6,3,2"
    tree = by["spec+tree"]
    assert tree["identical"]["equal"] == CYCLES and tree["errors"] == 0 and tree["tree_steps"] > 0
    assert by["spec"]["tree_steps"] == 0 and tree["tau"] > 1.0
    alphas = {tree["alpha_routine"], tree["alpha_commitment"]}
    assert alphas <= {1.0, None} and 1.0 in alphas, tree
    with pytest.raises(SystemExit) as e:
        bench.main(args(preset, drives, tmp_path / "x.json") + ["--modes", "spec+tree"])
    assert e.value.code == 2 and "--trees" in capsys.readouterr().err


def test_a_mode_with_no_successful_cycle_prints_a_dash_and_says_why(preset, drives, tmp_path, capsys):  # noqa: F811
    """Every cycle's history jumps 80 m (the planner refuses it as input): the run ends, exit 0,
    the JSON is written, and the table prints "-" where a number would need a successful cycle."""
    from safetensors.numpy import load_file, save_file
    from scenes.dataset import file_sha256

    bad = tmp_path / "bad"
    shutil.copytree(drives, bad)
    shard = next(bad.glob("test/*.safetensors"))
    arrays = load_file(str(shard))
    arrays["history"][:, :4, 0] -= 80.0
    save_file(arrays, str(shard), metadata={"format": "specdrive-drives-v2"})
    manifest = json.loads((bad / "manifest.json").read_text())
    for e in manifest["splits"]["test"]["drives"]:
        e["sha256"]["safetensors"] = file_sha256(bad / f"{e['file']}.safetensors")
    (bad / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "r.json"
    assert bench.main(args(preset, bad, out) + ["--modes", "spec"]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    for m in rec["modes"]:
        assert m["ok_cycles"] == 0 and m["cycle_speedup_p50"] is None and m["failed"].startswith(
            f"no successful cycle of {CYCLES}"), m
        row = next(line for line in text.splitlines() if line.startswith(m["name"] + " "))
        assert row.split()[1:4] == ["-", "-", "-"], row
        assert f"{m['name']}: - where no number can be given: no successful cycle of {CYCLES}" in text
    assert "input" in rec["modes"][0]["failed"] or "history" in rec["modes"][0]["failed"], rec["modes"][0]["failed"]


@pytest.mark.parametrize("where", ["folder", "under a file", "md is a folder"])
def test_json_that_cannot_be_written_exits_2_before_the_run(preset, drives, tmp_path, capsys, where):  # noqa: F811
    (tmp_path / "f").write_text("x")
    (tmp_path / "r.md").mkdir()
    out = {"folder": tmp_path, "under a file": tmp_path / "f" / "r.json", "md is a folder": tmp_path / "r.json"}[where]
    with pytest.raises(SystemExit) as e:
        bench.main(args(preset, drives, out))
    assert e.value.code == 2
    err = capsys.readouterr()
    assert ("is a folder" in err.err or "is a file, not a folder" in err.err), err.err
    assert "drive cycles" not in err.err        # no cycle ran


def test_the_drives_fingerprint_is_printed_and_a_pin_that_differs_exits_2(preset, drives, tmp_path, capsys):  # noqa: F811
    from core.artifacts import folder_fingerprint

    fp = folder_fingerprint(drives)
    with pytest.raises(SystemExit) as e:
        bench.main(args(preset, drives, tmp_path / "x.json") + ["--expect-drives-fingerprint", "0" * 64])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"has the fingerprint {fp}, not the {'0' * 64} pinned by --expect-drives-fingerprint" in err, err
    assert not (tmp_path / "x.json").exists()
    out = tmp_path / "ok.json"
    assert bench.main(args(preset, drives, out) + ["--modes", "spec", "--expect-drives-fingerprint", fp]) == 0
    assert f"fingerprint {drives}: {fp} (pinned)" in capsys.readouterr().out.splitlines()[0]
    assert json.loads(out.read_text())["setup"]["fingerprints"] == {str(drives): fp}


@pytest.mark.parametrize("field, value, says", [
    ("drives", 10_001, r"--drive-count=10001 is out of range; allowed \[1, 10000\]"),
    ("drives", 0, r"--drive-count=0 is out of range; allowed \[1, 10000\]"),
    ("cycles", 121, r"--cycles=121 is out of range; allowed \[1, 120\]"),
    ("warmup", 101, r"--warmup=101 is out of range; allowed \[0, 100\]"),
    ("max_reasoning_tokens", 0, r"--max-reasoning=0 is out of range; allowed \[1, 4096\]"),
    ("k", 17, r"k=17 is out of range; allowed \[1, 16\]"),
])
def test_every_number_of_bench_drives_has_a_range_that_says_its_bounds(field, value, says):
    from bench.bench.drives.measure import DriveBenchConfig
    from core.config import ConfigError

    DriveBenchConfig()
    with pytest.raises(ConfigError, match=says):
        DriveBenchConfig(**{field: value})


def test_streaming_modes_run_on_a_frame_local_target_and_are_refused_on_a_causal_one(
        frame_local_ckpt, preset, drives, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "stream.json"
    common = ["--drives", str(drives), "--drive-count", "1", "--cycles", str(CYCLES), "--warmup", "0",
              "--max-reasoning", "6", "--threads", "1"]
    assert bench.main(["--checkpoint", str(frame_local_ckpt), *common, "--json", str(out),
                       "--modes", "spec+vision+lookup,spec+vision+lookup+stream"]) == 0
    rec = json.loads(out.read_text())
    by = {m["name"]: m for m in rec["modes"]}
    assert list(by) == ["plain", "spec+vision+lookup", "spec+vision+lookup+stream"]
    s = by["spec+vision+lookup+stream"]
    assert s["identical"]["equal"] == CYCLES, s["identical"]
    assert s["blocks_kept_per_cycle"] == pytest.approx(4 * (CYCLES - 5) / CYCLES, abs=1e-3)
    assert by["spec+vision+lookup"]["blocks_kept_per_cycle"] == 0
    assert s["prefill_cut"] is not None and by["spec+vision+lookup"]["prefill_cut"] is None
    assert set(rec["goal"]["streaming"]) >= {"speedup", "prefill_cut", "identical", "met"}
    with pytest.raises(SystemExit) as e:
        bench.main(["--preset", str(preset), "--random-init", "0", "--drafts", "self", *common,
                    "--json", str(tmp_path / "x.json"), "--modes", "spec+vision+stream"])
    assert e.value.code == 2
    assert "frame_local" in capsys.readouterr().err
