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


@pytest.mark.parametrize("damage,word", [("truncate", "unreadable"), ("version", "world version")])
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
