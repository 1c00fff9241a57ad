"""Dataset shards: byte-identical for a seed whatever the worker count, loader round trip, splits."""
import hashlib
from pathlib import Path

import numpy as np
import pytest

from scenes.config import FAMILIES, ConfigError, UNSEEN_FAMILY
from scenes.dataset import GenerateConfig, generate, load, scene_seed, split_counts
from scenes.world import make_scene, pick_family


def _digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    for name, seed, workers in (("one", 4, 1), ("two", 4, 2), ("other", 5, 1)):
        generate(GenerateConfig(str(root / name), 30, seed=seed, workers=workers, shard_size=7), progress=False)
    return root


def test_same_seed_gives_byte_identical_shards_for_1_and_2_workers(datasets):
    one, two = _digests(datasets / "one"), _digests(datasets / "two")
    assert one == two, f"files differ: {sorted(k for k in one if one[k] != two.get(k))}"
    assert any(k.endswith(".safetensors") for k in one) and "manifest.json" in one
    other = _digests(datasets / "other")
    assert other.keys() == one.keys() and all(other[k] != one[k] for k in one if "shard" in k)


def test_only_safetensors_and_json_are_written(datasets):
    suffixes = {p.suffix for p in (datasets / "one").rglob("*") if p.is_file()}
    assert suffixes == {".safetensors", ".json"}


def test_loader_gives_back_what_make_scene_made(datasets):
    data = load(datasets / "one", "train")
    assert len(data) == split_counts(30, ("free_cruise", UNSEEN_FAMILY))["train"]
    for i in (0, 8, len(data) - 1):
        got = data[i]
        seed = scene_seed(4, "train", i)
        want = make_scene(seed, pick_family(seed, "train"), "train")
        assert got.seed == seed and got.family == want.family and got.coc == want.coc
        assert got.coc_routine == want.coc_routine and got.cause == want.cause and got.decision == want.decision
        for name in ("history", "future", "images", "ids", "agent_poses"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        assert got.ids.dtype == np.int16
    assert sum(1 for _ in data) == len(data)
    with pytest.raises(IndexError, match="allowed 0.."):
        data[len(data)]


def test_splits_and_the_unseen_family(datasets):
    counts = {split: len(load(datasets / "one", split)) for split in ("train", "val", "test", "heldout", "unseen")}
    assert sum(counts.values()) == 30 and counts["train"] == 24
    unseen = list(load(datasets / "one", "unseen"))
    assert unseen and all(s.family == UNSEEN_FAMILY and s.unseen_family for s in unseen)
    for split in ("train", "val", "test", "heldout"):
        assert all(s.family != UNSEEN_FAMILY and not s.unseen_family for s in load(datasets / "one", split))


def test_families_option_restricts_what_is_drawn(tmp_path):
    manifest = generate(GenerateConfig(str(tmp_path), 12, families=("follow", "curve"), render=False),
                        progress=False)
    assert "unseen" not in manifest.splits
    drawn = {s.family for split in manifest.splits for s in load(tmp_path, split)}
    assert drawn <= {"follow", "curve"} and drawn
    assert load(tmp_path, "train")[0].images is None


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n=0"), ({"n": 5, "workers": 0}, "workers=0"), ({"n": 5, "families": ("fog",)}, "'fog'.*allowed"),
    ({"n": 5, "families": ("cut_in",)}, "held out"), ({"n": 5, "seed": -1}, "seed=-1"),
])
def test_bad_config_is_refused(kwargs, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        GenerateConfig(str(tmp_path), **kwargs)


def test_missing_dataset_or_split_is_refused(tmp_path, datasets):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nowhere", "train")
    with pytest.raises(ConfigError, match="no manifest"):
        load(tmp_path, "train")
    with pytest.raises(ConfigError, match="'dev' is not in"):
        load(datasets / "one", "dev")


def test_one_split_is_the_share_a_whole_run_writes_there(tmp_path, datasets):
    """--split with --n: a fresh test range without rendering the other splits."""
    only = generate(GenerateConfig(str(tmp_path / "test-only"), 30, seed=4, shard_size=7, split="test"),
                    progress=False)
    assert list(only.counts) == ["test"] and only.counts["test"] == split_counts(30, FAMILIES)["test"]
    whole = _digests(datasets / "one")
    mine = _digests(tmp_path / "test-only")
    shards = [k for k in mine if k.startswith("test/")]
    assert shards and all(mine[k] == whole[k] for k in shards)
    with pytest.raises(ConfigError, match="'train' is not in"):
        load(tmp_path / "test-only", "train")
    with pytest.raises(ConfigError, match="give it none; raise --n"):
        generate(GenerateConfig(str(tmp_path / "tiny"), 3, split="unseen"), progress=False)
    with pytest.raises(ConfigError, match="'dev' is not a split"):
        GenerateConfig(str(tmp_path / "x"), 30, split="dev")


def test_bench_takes_a_dataset_split_whose_scenes_differ_from_the_synthetic_seeds(datasets):
    """`bench --data DIR --split val`: the split's own scenes. Synthetic scenes from a seed are the
    same in val and test, so without a dataset `--split val` would bench the test scenes."""
    from bench.bench.command import bench_scenes
    from bench.bench.measure import BenchConfig

    val = bench_scenes(BenchConfig(scenes=2, split="val", data=datasets / "one"))
    assert [s.name for s in val] == ["val/0", "val/1"]
    assert np.array_equal(val[0].images, load(datasets / "one", "val")[0].images)
    synthetic = {s: bench_scenes(BenchConfig(scenes=1, seed=0, split=s))[0] for s in ("val", "test")}
    assert np.array_equal(synthetic["val"].images, synthetic["test"].images)
    assert not np.array_equal(val[0].images, synthetic["val"].images)
    n = len(load(datasets / "one", "val"))
    with pytest.raises(ConfigError, match=rf"holds {n} scenes; allowed 1..{n}"):
        bench_scenes(BenchConfig(scenes=n + 1, split="val", data=datasets / "one"))
