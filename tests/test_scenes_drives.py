"""Drives: a scenario unrolled in 10 Hz cycles, their shards, their GIF, closed-loop rendering, and
frames entering the vision tower as separate images."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.config import ConfigError
from scenes import language as L
from scenes.config import DRIVE_SECONDS, DT, FRAME_OFFSETS, N_STEPS
from scenes.dataset import DriveConfig, generate_drives, load_drives, scene_seed
from scenes.drive import history_at, render_cycle
from scenes.world import make_drive, make_scene, pick_family, snapshot_cycle

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def drives():
    """Six unrendered 8 s test-split drives (labels only)."""
    return [make_drive(scene_seed(2, "test", i), None, "test", DRIVE_SECONDS, render=False) for i in range(6)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("drives")
    generate_drives(DriveConfig(str(out / "a"), 2, 1.5, 4, "test"), progress=False)
    generate_drives(DriveConfig(str(out / "b"), 2, 1.5, 4, "test", workers=2), progress=False)
    return out


def test_same_seed_gives_the_same_bytes_for_1_and_2_workers(shards):
    files = sorted(p.relative_to(shards / "a") for p in (shards / "a").rglob("*") if p.is_file())
    assert len(files) == 5                      # manifest + 2 x (safetensors, json)
    for f in files:
        assert (shards / "a" / f).read_bytes() == (shards / "b" / f).read_bytes(), f


def test_a_drive_is_10_hz_cycles_with_what_the_planner_gets_then(shards):
    drive = load_drives(shards / "a", "test")[0]
    assert len(drive.cycles) == 15
    times = np.array([c.time for c in drive.cycles])
    assert np.allclose(np.diff(times), DT)
    for c, n in zip(drive.cycles, drive.steps):
        assert c.images.shape[:2] == (4, len(FRAME_OFFSETS)) and c.history.shape == (16, 3)
        assert np.allclose(c.history, history_at(drive.ego_world.astype(np.float64), int(n)), atol=1e-4)
        assert c.future.shape == (64, 3) and len(c.coc_routine) == len(c.coc.split(" "))
    same = [np.array_equal(a.images[:, 1], b.images[:, 0]) for a, b in zip(drive.cycles, drive.cycles[5:])]
    assert all(same), "the t - 0.5 s frame of a cycle is the t frame of the cycle 5 before it"


def test_a_snapshot_is_one_cycle_of_its_drive():
    seed = scene_seed(0, "train", 7)
    fam = pick_family(seed, "train")
    snap = make_scene(seed, fam, "train")
    cyc = make_drive(seed, fam, "train", DRIVE_SECONDS).cycles[snapshot_cycle(seed)]
    assert snap.coc == cyc.coc and snap.decision == cyc.decision and snap.cycle == cyc.cycle
    assert np.array_equal(snap.history, cyc.history) and np.array_equal(snap.images, cyc.images)


def test_the_commitment_changes_at_moments_and_holds_between(drives):
    changes = transitions = routine_moves = 0
    for d in drives:
        keys = [(c.cause_kind, tuple(sorted(c.cause_facts.items())), c.decision) for c in d.cycles]
        changes += sum(a != b for a, b in zip(keys, keys[1:]))
        transitions += len(keys) - 1
        speeds = [L.history_facts(c.history)["speed"] for c in d.cycles]
        routine_moves += sum(abs(a - b) > 1e-6 for a, b in zip(speeds, speeds[1:]))
    assert 0 < changes <= transitions // 5, f"{changes} commitment changes in {transitions} transitions"
    assert routine_moves > transitions // 2, "the routine part should follow the history every cycle"


def test_every_cycle_of_a_drive_grades_itself_right(drives):
    from scenes.grade import commitment_correct

    for d in drives:
        for c in d.cycles:
            assert commitment_correct(c.coc.split(" "), c) == (True, True), c.coc


def test_closed_loop_renders_the_ego_path_it_is_given():
    seed = scene_seed(1, "test", 3)
    drive = make_drive(seed, None, "test", 1.0)
    scen, n = drive.scenario, int(drive.steps[4])
    images, history = render_cycle(scen, drive.ego_world, n)
    assert np.array_equal(images, drive.cycles[4].images) and np.allclose(history, drive.cycles[4].history, atol=1e-5)
    shifted = drive.ego_world.astype(np.float64).copy()
    shifted[n - 20:, 1] += np.linspace(0.0, 1.5, N_STEPS - (n - 20))        # the ego drifts left
    images2, history2 = render_cycle(scen, shifted, n)
    assert not np.array_equal(images2, images), "another ego path must give other camera images"
    assert not np.allclose(history2, history), "the history must come from the ego's actual path"
    with pytest.raises(ValueError, match="finite world poses"):
        bad = shifted.copy()
        bad[n - 3, 0] = np.nan
        render_cycle(scen, bad, n)


def test_truncated_or_foreign_shards_are_refused(shards, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(shards / "a", root)
    f = root / "test" / "drive-00000.safetensors"
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with pytest.raises(ConfigError, match="drive shard .*drive-00000.safetensors: sha256 .* differs from the "
                                          "manifest's field 'sha256.safetensors'"):
        load_drives(root, "test")[0]
    restamp(root)                         # the manifest rewritten to the cut file: still unreadable
    with pytest.raises(ConfigError, match="drive shard .* is unreadable"):
        load_drives(root, "test")[0]
    manifest = root / "manifest.json"
    manifest.write_text(manifest.read_text().replace("specdrive-drives-v2", "specdrive-drives-v1"))
    with pytest.raises(ConfigError, match="holds drives of format 'specdrive-drives-v1', not of this world "
                                          "version"):
        load_drives(root, "test")
    with pytest.raises(ConfigError, match="seconds=30"):
        DriveConfig(str(tmp_path / "x"), 1, 30.0)


@pytest.mark.parametrize("edit, says", [
    (lambda m: "{not json", "not readable JSON"),
    (lambda m: [m], "holds drives of format 'list'"),
    (lambda m: {k: v for k, v in m.items() if k != "splits"}, "field 'splits' is missing"),
    (lambda m: {**m, "splits": {"test": {**m["splits"]["test"], "drives": [{"cycles": 5}]}}},
     r"field 'splits.test.drives\[0\].file' is missing"),
    (lambda m: {**m, "splits": {"test": {**m["splits"]["test"], "drives": [{"file": "../../x", "cycles": 5}]}}},
     "outside the folder"),
    (lambda m: {**m, "splits": {"test": {**m["splits"]["test"], "count": "1"}}}, "field 'splits.test.count'"),
])
def test_a_damaged_drives_manifest_is_refused_naming_the_field(shards, tmp_path, edit, says):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(shards / "a", root)
    manifest = root / "manifest.json"
    edited = edit(json.loads(manifest.read_text()))
    manifest.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(ConfigError, match=says):
        load_drives(root, "test")


def test_show_writes_a_drive_gif(shards, tmp_path):
    gif = tmp_path / "drive.gif"
    r = subprocess.run([sys.executable, "-m", "tools.cli", "scenes", "show", str(shards / "a"), "--drive", "1",
                        "--every", "5", "--out", str(gif)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    from PIL import Image

    im = Image.open(gif)
    assert im.format == "GIF" and im.n_frames == 3
    r = subprocess.run([sys.executable, "-m", "tools.cli", "scenes", "show", str(shards / "a"), "--drive", "7",
                        "--out", str(gif)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--drive 7 is out of range" in r.stderr, r.stderr


def test_each_frame_is_its_own_image_in_the_vision_tower():
    """A frame's vision features depend on that frame alone (upstream feeds each frame as an
    image), so a later cycle can reuse them."""
    torch = pytest.importorskip("torch")
    from models.config import load_preset
    from models.vision import VisionTower
    from prompt.pixels import images_to_patches

    cfg = load_preset("tiny").target.vision
    torch.manual_seed(0)
    tower = VisionTower(cfg, 128).eval()
    imgs = make_scene(11, "follow", "test").images.reshape(-1, 64, 96, 3)         # (8, H, W, 3)
    with torch.no_grad():
        p, g = images_to_patches(imgs, cfg.patch, cfg.temporal_patch, cfg.merge)
        all_frames, deep = tower(torch.from_numpy(p), g)
        per = all_frames.shape[0] // len(imgs)
        for j in (0, 5):
            pj, gj = images_to_patches(imgs[j:j + 1], cfg.patch, cfg.temporal_patch, cfg.merge)
            alone, deep_alone = tower(torch.from_numpy(pj), gj)
            assert torch.allclose(alone, all_frames[j * per:(j + 1) * per], atol=1e-5)
            assert all(torch.allclose(a, b[j * per:(j + 1) * per], atol=1e-5) for a, b in zip(deep_alone, deep))


def test_a_red_light_is_a_stop_whatever_the_future_holds():
    """The frames show the colour, not when it changes: a red light's decision is to stop, also
    in drives where the light turns green inside the expert's 6.4 s future."""
    reds = turns = 0
    for i in range(8):
        d = make_drive(scene_seed(4, "test", i), "traffic_light", "test", DRIVE_SECONDS, render=False)
        for c in d.cycles:
            if c.cause_kind == "light" and c.cause_facts.get("light") == "red":
                reds += 1
                assert c.decision == "stop", (d.seed, c.cycle, c.coc)
                turns += int(c.future[-1, 0] - c.future[0, 0] > 5.0)
    assert reds > 20 and turns > 0, (reds, turns)


def test_a_named_cause_does_not_flicker_between_cycles():
    """Hysteresis: once named, a far agent whose pixel count aliases between steps stays named
    until it drops below HOLD_VISIBLE_PIXELS; it is never dropped and named again within 1 s."""
    flickers = named = 0
    for fam in ("pedestrian", "stop_sign", "traffic_light"):
        for i in range(3):
            causes = [c.cause for c in make_drive(scene_seed(3, "test", i), fam, "test", DRIVE_SECONDS,
                                                  render=False).cycles]
            named += sum(c is not None for c in causes)
            flickers += sum(1 for n in range(1, len(causes)) if causes[n - 1] is not None
                            and causes[n] != causes[n - 1] and causes[n - 1] in causes[n + 1: n + 11])
    assert named > 300 and flickers == 0, (named, flickers)


def restamp(root):
    """Rewrite a drives manifest's sha256 to the files as they are now (what a forger would do)."""
    from scenes.dataset import file_sha256

    manifest = root / "manifest.json"
    m = json.loads(manifest.read_text())
    for entries in m["splits"].values():
        for e in entries["drives"]:
            e["sha256"] = {ext: file_sha256(root / f"{e['file']}.{ext}") for ext in ("safetensors", "json")}
    manifest.write_text(json.dumps(m))


def edit_labels(change):
    def edit(root):
        f = root / "test" / "drive-00000.json"
        labels = json.loads(f.read_text())
        f.write_text(json.dumps(change(labels)))
    return edit


def edit_arrays(change):
    def edit(root):
        from safetensors.numpy import load_file, save_file

        f = root / "test" / "drive-00000.safetensors"
        arrays = load_file(str(f))
        change(arrays)
        save_file(arrays, str(f), metadata={"format": "specdrive-drives-v2"})
    return edit


def set_cycle(c, key, value):
    def change(labels):
        labels["cycles"][c][key] = value
        return labels
    return change


def inverted(arrays):
    arrays["images"] = 255 - arrays["images"]


SHARD_DAMAGE = {   # name -> (edit of the copied folder, what the error says)
    "labels cut to 5 cycles": (edit_labels(lambda d: {**d, "cycles": d["cycles"][:5]}),
                               r"field 'cycles' holds 5 cycles, the manifest's entry 'test/drive-00000' says 15"),
    "labels extended": (edit_labels(lambda d: {**d, "cycles": d["cycles"] + d["cycles"][-1:]}),
                        r"field 'cycles' holds 16 cycles, .* says 15"),
    "labels a list": (edit_labels(lambda d: d["cycles"]), r"field 'format' = None \(the file is a list"),
    "a label field missing": (edit_labels(lambda d: {**d, "cycles": [{k: v for k, v in c.items() if k != "coc"}
                                                                      for c in d["cycles"]]}),
                              r"field 'cycles\[0\].coc' is missing"),
    "another labels version": (edit_labels(lambda d: {**d, "format": "specdrive-drives-v1"}),
                               r"drive-00000.json: field 'format' = 'specdrive-drives-v1'; this specdrive reads "
                               r"'specdrive-drives-v2'"),
    "a time as text": (edit_labels(set_cycle(2, "time", "1.0")), r"field 'cycles\[2\].time' = '1.0' is not float"),
    "a time as a bool": (edit_labels(set_cycle(2, "time", True)), r"field 'cycles\[2\].time' = True is not float"),
    "a time of 1e303": (edit_labels(set_cycle(2, "time", 1e303)),
                        r"field 'cycles\[2\].time' = 1e\+303 is not the time of its grid step"),
    "a time not finite": (edit_labels(set_cycle(2, "time", float("nan"))),
                          r"field 'cycles\[2\].time' = nan is not a finite number"),
    "times out of order": (edit_labels(lambda d: {**d, "cycles": [d["cycles"][1], d["cycles"][0], *d["cycles"][2:]]}),
                           r"field 'cycles\[0\].time' = .* is not the time of its grid step"),
    "an array missing": (edit_arrays(lambda a: a.pop("ids")), r"missing \['ids'\]"),
    "an array of another dtype": (edit_arrays(lambda a: a.update(history=a["history"].astype(np.float64))),
                                  r"array 'history' is float64 \(15, 16, 3\), expected float32 \(15, 16, 3\)"),
    "array rows cut": (edit_arrays(lambda a: a.update(steps=a["steps"][:5])),
                       r"array 'steps' is int32 \(5,\), expected int32 \(15,\)"),
    "a frame missing": (edit_arrays(lambda a: a.update(frame_steps=a["frame_steps"] + 1000)),
                        r"array 'frame_steps' lacks the grid steps"),
    "pixels inverted, restamped": (edit_arrays(inverted), None),      # only a pinned fingerprint tells
}


@pytest.mark.parametrize("name", list(SHARD_DAMAGE))
def test_a_drive_shard_is_checked_whole(shards, tmp_path, name):
    """Each damage is refused twice: by the manifest's sha256 as it is, and, once the manifest is
    rewritten to the damaged files, by the check of what the files hold (naming file and field)."""
    import shutil

    edit, says = SHARD_DAMAGE[name]
    root = tmp_path / "d"
    shutil.copytree(shards / "a", root)
    load_drives(root, "test").check()                       # the copy itself is sound
    edit(root)
    with pytest.raises(ConfigError, match=r"drive-00000\.(json|safetensors): sha256 .* differs from the manifest"):
        load_drives(root, "test").check()
    restamp(root)
    if says is None:
        load_drives(root, "test").check()
        return
    with pytest.raises(ConfigError, match=says):
        load_drives(root, "test").check()
    with pytest.raises(ConfigError, match=says):
        load_drives(root, "test")[0]


def test_a_drives_folder_without_hashes_is_refused_saying_regenerate(shards, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(shards / "a", root)
    m = json.loads((root / "manifest.json").read_text())
    for e in m["splits"]["test"]["drives"]:
        del e["sha256"]
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"'splits.test.drives\[0\].sha256' is missing: .* older specdrive.*"
                                          "regenerate it with `specdrive scenes generate --drives N`"):
        load_drives(root, "test")
    m["splits"]["test"]["count"] = 3
    for e in m["splits"]["test"]["drives"]:
        e["sha256"] = {"safetensors": "0" * 64, "json": "0" * 64}
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match=r"'splits.test.count' = 3 but 'splits.test.drives' lists 2"):
        load_drives(root, "test")


def test_generate_refuses_a_file_another_dataset_and_values_out_of_range(tmp_path):
    from scenes.dataset import GenerateConfig

    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a folder"):
        DriveConfig(str(tmp_path / "f"), 1, 1.0)
    with pytest.raises(ConfigError, match="is a file; give a folder"):
        GenerateConfig(str(tmp_path / "f"), 4)
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "manifest.json").write_text(json.dumps({"format": "specdrive-scenes-v2"}))
    with pytest.raises(ConfigError, match="already holds a dataset of format 'specdrive-scenes-v2'; drives"):
        DriveConfig(str(snap), 1, 1.0)
    for kwargs, says in [({"drives": 10_001}, r"drives=10001 is out of range; allowed \[1, 10000\]"),
                         ({"drives": 0}, r"allowed \[1, 10000\]"),
                         ({"seconds": 0.05}, r"seconds=0.05 is out of range; allowed \[0.1, 12.0\]"),
                         ({"seed": -1}, r"seed=-1 is out of range; allowed \[0, 4294967295\]"),
                         ({"workers": 0}, r"workers=0 is out of range; allowed \[1, 256\]")]:
        with pytest.raises(ConfigError, match=says):
            DriveConfig(**{"out": str(tmp_path / "new"), "drives": 1, "seconds": 1.0, **kwargs})


def test_the_batched_token_check_equals_the_per_cycle_encoders():
    """make_drive checks every cycle of the longest drive against the trajectory tokens in one
    batch (scenes.world._cycles_fit_tokens): its verdict is the per-cycle encoders' on accepted and
    rejected draws, and its history bins are theirs bit for bit."""
    from prompt.trajectory import TrajectoryRangeError, encode_future, encode_history, history_bins
    from scenes.config import MAX_DRIVE_SECONDS, ranges_for
    from scenes.drive import cycle_steps, simulate_scenario, to_ego
    from scenes.world import BUILDERS, _cycles_fit_tokens

    def per_cycle(poses):
        for n in cycle_steps(MAX_DRIVE_SECONDS):
            try:
                encode_history(history_at(poses, n))
                encode_future(to_ego(poses[n + 1: n + 65], poses[n]))
            except TrajectoryRangeError:
                return False
        return True

    verdicts = []
    for split in ("train", "unseen"):
        for i in range(40):
            seed = scene_seed(5, split, i)
            scen = BUILDERS[pick_family(seed, split)](np.random.default_rng([seed, 0]), ranges_for(split))
            poses = simulate_scenario(scen).poses
            verdicts.append((per_cycle(poses), _cycles_fit_tokens(poses)))
            if verdicts[-1][0]:
                steps = cycle_steps(MAX_DRIVE_SECONDS)[::17]
                batch = np.stack([history_at(poses, int(n)) for n in steps])
                assert np.array_equal(history_bins(batch)[0], np.stack([encode_history(h) for h in batch]))
    assert all(a == b for a, b in verdicts), verdicts
    assert {a for a, _ in verdicts} == {True, False}, "the draws must include rejected ones"
    # a history no bin holds is named by both
    fast = np.zeros((16, 3)); fast[:, 0] = np.arange(-15, 1) * 4.0
    assert history_bins(fast)[1] == 14
    with pytest.raises(TrajectoryRangeError, match="ego history pose 14 moves"):
        encode_history(fast)
