"""Datasets of scenes: shards of safetensors (arrays) + JSON (text and labels), and their loader.

Layout of a dataset directory:
    manifest.json                       what was generated, splits, shard list (no timestamps)
    <split>/shard-00000.safetensors     history, future, images, ids (int8 on disk), agent_poses, agent_count
    <split>/shard-00000.json            per scene: seed, family, cause, decision, coc, flags, agents

Scene i of a split has the seed SeedSequence([seed, split number, i]); a shard holds a fixed
range of indices, so the bytes do not depend on how many workers wrote them.
"""
from __future__ import annotations

import json
import re
import multiprocessing as mp
import queue as queue_lib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from prompt.artifacts import Table
from scenes.config import (CAMERAS, DECISIONS, DRIVE_SECONDS, DT, FAMILIES, FRAME_OFFSETS, LIMITS,
                           MAX_DRIVE_SECONDS, SPLIT_FRACTIONS, SPLITS, UNSEEN_FAMILY, ConfigError, check_families)
from scenes.render import IMAGE_H, IMAGE_W
from scenes.world import Drive, Scene, make_drive, make_scene, pick_family

FORMAT = "specdrive-scenes-v2"     # world v2: snapshots are cycles of drives; the v2 language
DRIVE_FORMAT = "specdrive-drives-v2"
WHAT = {FORMAT: "scenes", DRIVE_FORMAT: "drives"}
MAKE = {FORMAT: "specdrive scenes generate", DRIVE_FORMAT: "specdrive scenes generate --drives N"}
MAX_AGENTS = 16                  # agent_poses is padded with NaN to this many agents (ids fit int8)
_progress = None                 # worker-side queue for the parent's progress bar


@dataclass(frozen=True)
class GenerateConfig:
    out: str
    n: int
    seed: int = 0
    families: tuple = FAMILIES
    workers: int = 1
    shard_size: int = 256
    render: bool = True

    def __post_init__(self):
        if not isinstance(self.n, int) or self.n <= 0:
            raise ConfigError(f"n={self.n!r} must be a positive number of scenes")
        if self.workers < 1:
            raise ConfigError(f"workers={self.workers!r} must be at least 1")
        if self.shard_size < 1:
            raise ConfigError(f"shard_size={self.shard_size!r} must be at least 1")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"seed={self.seed!r} is out of range; allowed [0, 2**32)")
        object.__setattr__(self, "families", check_families(self.families))
        if set(self.families) == {UNSEEN_FAMILY}:
            raise ConfigError(f"families={list(self.families)}: {UNSEEN_FAMILY!r} is held out (split 'unseen' "
                              f"only); name at least one of {', '.join(f for f in FAMILIES if f != UNSEEN_FAMILY)}")


def split_counts(n: int, families) -> dict:
    """Scenes per split (largest remainders, summing to n); 'unseen' only when cut-in is asked for."""
    fractions = {s: f for s, f in SPLIT_FRACTIONS.items() if s != "unseen" or UNSEEN_FAMILY in families}
    total = sum(fractions.values())
    exact = {s: n * f / total for s, f in fractions.items()}
    counts = {s: int(np.floor(v)) for s, v in exact.items()}
    for s in sorted(exact, key=lambda s: (counts[s] - exact[s], SPLITS.index(s)))[: n - sum(counts.values())]:
        counts[s] += 1
    return counts


def scene_seed(seed: int, split: str, index: int) -> int:
    return int(np.random.SeedSequence([seed, SPLITS.index(split), index]).generate_state(1)[0])


def generate(cfg: GenerateConfig, progress: bool = True) -> DatasetManifest:
    """Write the dataset described by cfg; returns its manifest (also written as manifest.json)."""
    out = Path(cfg.out)
    counts = split_counts(cfg.n, cfg.families)
    jobs = [(cfg, split, k, start, min(start + cfg.shard_size, count))
            for split, count in counts.items() for k, start in enumerate(range(0, count, cfg.shard_size))]
    for split in counts:
        (out / split).mkdir(parents=True, exist_ok=True)
        for old in (out / split).glob("shard-*"):       # shards of an earlier run in this directory
            if re.fullmatch(r"shard-\d{5}\.(safetensors|json)", old.name):
                old.unlink()
    results = _run(jobs, cfg.workers, cfg.n, progress)
    manifest = {"format": FORMAT, "seed": cfg.seed, "n": cfg.n, "families": list(cfg.families),
                "render": cfg.render, "image_shape": [IMAGE_H, IMAGE_W], "cameras": [c.name for c in CAMERAS],
                "frame_times_s": [round(-k * DT, 3) for k in FRAME_OFFSETS], "dt_s": DT,
                "unseen_family": UNSEEN_FAMILY, "limits": asdict(LIMITS), "decisions": list(DECISIONS),
                "splits": {}}
    for split, count in counts.items():
        mine = [r for r in results if r["split"] == split]
        family_counts = {}
        for r in mine:
            for f, c in r["families"].items():
                family_counts[f] = family_counts.get(f, 0) + c
        manifest["splits"][split] = {"count": count, "family_counts": dict(sorted(family_counts.items())),
                                     "shards": [{"file": r["file"], "count": r["count"]} for r in mine]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return DatasetManifest.from_dict(manifest, out, FORMAT)


def _run(jobs, workers: int, total: int, progress: bool) -> list:
    from tqdm import tqdm

    bar = tqdm(total=total, desc="scenes", unit="scene", disable=not progress)
    if workers == 1:
        results = [_write_shard(job, bar.update) for job in jobs]
    else:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        q = ctx.Queue()
        with ctx.Pool(workers, initializer=_init_worker, initargs=(q,)) as pool:
            pending = pool.map_async(_write_shard, jobs, chunksize=1)
            while not pending.ready():
                try:
                    bar.update(q.get(timeout=0.2))
                except queue_lib.Empty:
                    pass
            results = pending.get()
        bar.update(total - bar.n)
    bar.close()
    return sorted(results, key=lambda r: (SPLITS.index(r["split"]), r["file"]))


def _init_worker(q) -> None:
    global _progress
    _progress = q


def _write_shard(job, tick=None) -> dict:
    cfg, split, k, start, stop = job
    tick = tick or (_progress.put if _progress is not None else (lambda n: None))
    scenes = []
    for i in range(start, stop):
        seed = scene_seed(cfg.seed, split, i)
        scenes.append(make_scene(seed, pick_family(seed, split, cfg.families), split, render=cfg.render))
        tick(1)
    name = f"{split}/shard-{k:05d}"
    save_file(_arrays(scenes), str(Path(cfg.out) / f"{name}.safetensors"), metadata={"format": FORMAT})
    text = {"format": FORMAT, "split": split, "first_index": start, "scenes": [_labels(s) for s in scenes]}
    (Path(cfg.out) / f"{name}.json").write_text(json.dumps(text, sort_keys=True, separators=(",", ":")) + "\n")
    families = {}
    for s in scenes:
        families[s.family] = families.get(s.family, 0) + 1
    return {"split": split, "file": name, "count": len(scenes), "families": families}


def _arrays(scenes) -> dict:
    n = len(scenes)
    poses = np.full((n, MAX_AGENTS, 80, 3), np.nan, dtype=np.float32)
    for j, s in enumerate(scenes):
        if len(s.agents) > MAX_AGENTS:
            raise RuntimeError(f"scene seed {s.seed} has {len(s.agents)} agents; at most {MAX_AGENTS} fit a shard")
        poses[j, : len(s.agents)] = s.agent_poses
    arrays = {"history": np.stack([s.history for s in scenes]), "future": np.stack([s.future for s in scenes]),
              "agent_poses": poses, "agent_count": np.array([len(s.agents) for s in scenes], dtype=np.int32)}
    if scenes[0].images is not None:
        arrays["images"] = np.stack([s.images for s in scenes])
        arrays["ids"] = np.stack([s.ids for s in scenes]).astype(np.int8)    # int16 again on load
    return arrays


def _labels(s: Scene) -> dict:
    return {"seed": s.seed, "family": s.family, "cause": s.cause, "decision": s.decision, "coc": s.coc,
            "coc_routine": s.coc_routine, "cause_kind": s.cause_kind, "cause_facts": s.cause_facts,
            "cycle": s.cycle, "time": s.time, "unseen_family": s.unseen_family,
            "agents": s.agents, "roads": s.roads, "paint": s.paint}


class SceneDataset:
    """Indexable scenes of one split; arrays are read from the shards on demand."""

    def __init__(self, root, split: str):
        root = Path(root)
        if not root.is_dir():
            raise ConfigError(f"dataset directory {str(root)!r} does not exist")
        self.root, self.split = root, split
        self.manifest = read_dataset_manifest(root)
        self.shards = self.manifest.parts(split)
        self._starts = np.cumsum([0] + [s.count for s in self.shards])
        self._text, self._arrays = {}, {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, i: int) -> Scene:
        if not isinstance(i, (int, np.integer)) or not 0 <= i < len(self):
            raise IndexError(f"index {i!r} is out of range for split {self.split!r}; allowed 0..{len(self) - 1}")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        row = int(i - self._starts[k])
        labels = self._shard_text(k)["scenes"][row]
        f = self._shard_arrays(k)
        names = set(f.keys())
        count = int(f.get_slice("agent_count")[row])
        return Scene(f.get_slice("history")[row], f.get_slice("future")[row], labels["coc"], labels["coc_routine"],
                     labels["family"], labels["cause"], labels["decision"], labels["agents"],
                     f.get_slice("agent_poses")[row][:count], split=self.split, seed=labels["seed"],
                     cause_kind=labels["cause_kind"], cause_facts=labels["cause_facts"], cycle=labels["cycle"],
                     time=labels["time"], unseen_family=labels["unseen_family"],
                     roads=labels["roads"], paint=labels["paint"],
                     images=f.get_slice("images")[row] if "images" in names else None,
                     ids=f.get_slice("ids")[row].astype(np.int16) if "ids" in names else None)

    def _shard_text(self, k: int) -> dict:
        if k not in self._text:
            self._text[k] = json.loads((self.root / f"{self.shards[k].file}.json").read_text())
        return self._text[k]

    def _shard_arrays(self, k: int):
        if k not in self._arrays:
            self._arrays[k] = safe_open(str(self.root / f"{self.shards[k].file}.safetensors"), framework="numpy")
        return self._arrays[k]


# --- manifest.json, typed once ----------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One pair of files of a split, <file>.safetensors and <file>.json (relative to the folder,
    inside it): a shard of `count` scenes, or one drive of `count` cycles."""
    file: str
    count: int


@dataclass(frozen=True)
class DatasetManifest:
    """A dataset folder's manifest.json (snapshots or drives), read once and checked whole."""
    root: Path
    format: str
    splits: dict                    # {split: tuple[Part, ...]}
    counts: dict                    # {split: scenes or drives}

    def parts(self, split: str) -> tuple:
        """The shards (snapshots) or drives of one split."""
        if split not in self.splits:
            raise ConfigError(f"split={split!r} is not in {str(self.root)!r}; it has {', '.join(self.splits)}")
        return self.splits[split]

    @classmethod
    def from_dict(cls, manifest, root: Path, fmt: str) -> DatasetManifest:
        where = f"{root / 'manifest.json'}"
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        if got != fmt:
            raise ConfigError(f"{root} holds {WHAT[fmt]} of format {got!r}, not of this world version "
                              f"({fmt!r}): regenerate it with `{MAKE[fmt]}`")
        key, size = ("drives", "cycles") if fmt == DRIVE_FORMAT else ("shards", "count")
        splits, counts = {}, {}
        f = Table(manifest, where).table("splits")
        for split in f.data:
            entry = f.table(split)
            parts = []
            for i, part in enumerate(entry(key, list)):
                t = Table(part, where, f"splits.{split}.{key}[{i}].")
                parts.append(Part(_inside(root, t("file", str), where, t.prefix), t(size, int)))
            splits[split], counts[split] = tuple(parts), entry("count", int)
        return cls(Path(root), fmt, splits, counts)


def _inside(root: Path, file: str, where: str, field: str) -> str:
    """`file`, a path relative to the dataset folder that stays inside it."""
    base = Path(root).resolve()
    if Path(file).is_absolute() or not (base / file).resolve().is_relative_to(base):
        raise ConfigError(f"{where}: field '{field}file' = {file!r} is outside the folder; shard files are "
                          "paths relative to the dataset folder, inside it")
    return file


def read_dataset_manifest(root: Path, fmt: str = FORMAT) -> DatasetManifest:
    """manifest.json of a dataset of this world version (snapshots: FORMAT, drives: DRIVE_FORMAT),
    or a ConfigError saying what is wrong."""
    file = Path(root) / "manifest.json"
    if not file.is_file():
        raise ConfigError(f"{str(root)!r} has no manifest.json; make {WHAT[fmt]} with `{MAKE[fmt]}`")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file} is not readable JSON ({e}); regenerate it with `{MAKE[fmt]}`") from None
    return DatasetManifest.from_dict(manifest, Path(root), fmt)


def load(root, split: str = "train") -> SceneDataset:
    """The scenes of one split of a generated dataset (indexable, iterable)."""
    return SceneDataset(root, split)


# ---------------------------------------------------------------- drives
@dataclass(frozen=True)
class DriveConfig:
    out: str
    drives: int
    seconds: float = DRIVE_SECONDS
    seed: int = 0
    split: str | None = None      # None: drives spread over the splits like scenes; else all in one
    families: tuple = FAMILIES
    workers: int = 1

    def __post_init__(self):
        if not isinstance(self.drives, int) or self.drives <= 0:
            raise ConfigError(f"drives={self.drives!r} must be a positive number of drives")
        if not 0.1 <= float(self.seconds) <= MAX_DRIVE_SECONDS:
            raise ConfigError(f"seconds={self.seconds!r}: a drive lasts 0.1 .. {MAX_DRIVE_SECONDS} s")
        if self.workers < 1:
            raise ConfigError(f"workers={self.workers!r} must be at least 1")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"seed={self.seed!r} is out of range; allowed [0, 2**32)")
        if self.split is not None and self.split not in SPLITS:
            raise ConfigError(f"split={self.split!r} unknown; allowed: {', '.join(SPLITS)}")
        object.__setattr__(self, "families", check_families(self.families))


def generate_drives(cfg: DriveConfig, progress: bool = True) -> DatasetManifest:
    """Write drive shards (one drive per shard) and manifest.json; the same seed gives the same bytes.
    Drive i of a split has the seed of scene i of that split, so snapshot i is one of its cycles."""
    out = Path(cfg.out)
    counts = {cfg.split: cfg.drives} if cfg.split else split_counts(cfg.drives, cfg.families)
    jobs = [(cfg, split, i) for split, count in counts.items() for i in range(count)]
    for split in counts:
        (out / split).mkdir(parents=True, exist_ok=True)
        for old in (out / split).glob("drive-*"):
            if re.fullmatch(r"drive-\d{5}\.(safetensors|json)", old.name):
                old.unlink()
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc="drives", unit="drive", disable=not progress)
    if cfg.workers == 1:
        results = []
        for job in jobs:
            results.append(_write_drive(job))
            bar.update(1)
    else:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        with ctx.Pool(cfg.workers) as pool:
            results = []
            for r in pool.imap(_write_drive, jobs):
                results.append(r)
                bar.update(1)
    bar.close()
    manifest = {"format": DRIVE_FORMAT, "seed": cfg.seed, "drives": cfg.drives, "seconds": float(cfg.seconds),
                "families": list(cfg.families), "image_shape": [IMAGE_H, IMAGE_W],
                "cameras": [c.name for c in CAMERAS], "frame_times_s": [round(-k * DT, 3) for k in FRAME_OFFSETS],
                "dt_s": DT, "splits": {}}
    for split, count in counts.items():
        manifest["splits"][split] = {"count": count, "drives": [r for r in results if r["split"] == split]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return DatasetManifest.from_dict(manifest, out, DRIVE_FORMAT)


def _write_drive(job) -> dict:
    cfg, split, i = job
    seed = scene_seed(cfg.seed, split, i)
    drive = make_drive(seed, pick_family(seed, split, cfg.families), split, float(cfg.seconds))
    name = f"{split}/drive-{i:05d}"
    steps = drive.steps
    frame_steps = np.array(sorted({int(n) - k for n in steps for k in FRAME_OFFSETS}), dtype=np.int32)
    where = {int(n): j for j, n in enumerate(frame_steps)}
    images = np.zeros((len(frame_steps), *drive.cycles[0].images.shape[:1], *drive.cycles[0].images.shape[2:]),
                      dtype=np.uint8)
    ids = np.zeros(images.shape[:-1], dtype=np.int8)
    for scene, n in zip(drive.cycles, steps):
        for f, k in enumerate(FRAME_OFFSETS):
            images[where[int(n) - k]] = scene.images[:, f]
            ids[where[int(n) - k]] = scene.ids[:, f]
    arrays = {"images": images, "ids": ids, "frame_steps": frame_steps, "steps": steps.astype(np.int32),
              "ego_world": drive.ego_world, **{k: v for k, v in _arrays(
                  [_no_pixels(s) for s in drive.cycles]).items()}}
    save_file(arrays, str(Path(cfg.out) / f"{name}.safetensors"), metadata={"format": DRIVE_FORMAT})
    text = {"format": DRIVE_FORMAT, "split": split, "index": i, "seed": seed, "family": drive.family,
            "seconds": drive.seconds, "cycles": [_labels(s) for s in drive.cycles]}
    (Path(cfg.out) / f"{name}.json").write_text(json.dumps(text, sort_keys=True, separators=(",", ":")) + "\n")
    return {"split": split, "file": name, "family": drive.family, "cycles": len(drive.cycles), "seed": seed}


def _no_pixels(scene: Scene) -> Scene:
    from dataclasses import replace

    return replace(scene, images=None, ids=None)


class DriveDataset:
    """Drives of one split: `ds[i]` is a Drive whose cycles carry their camera frames."""

    def __init__(self, root, split: str):
        self.root, self.split = Path(root), split
        self.manifest = read_dataset_manifest(self.root, DRIVE_FORMAT)
        self.entries = self.manifest.parts(split)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> Drive:
        if not isinstance(i, (int, np.integer)) or not 0 <= i < len(self):
            raise IndexError(f"drive {i!r} is out of range for split {self.split!r}; allowed 0..{len(self) - 1}")
        file = self.root / self.entries[i].file
        try:
            labels = json.loads(file.with_suffix(".json").read_text())
            with safe_open(str(file.with_suffix(".safetensors")), framework="numpy") as f:
                arrays = {k: f.get_tensor(k) for k in f.keys()}
                fmt = (f.metadata() or {}).get("format")
        except Exception as e:           # truncated or foreign files: say which and what to do
            raise ConfigError(f"drive shard {file} is unreadable ({type(e).__name__}: {e}); "
                              "regenerate it with `specdrive scenes generate --drives N`") from None
        if fmt != DRIVE_FORMAT or labels.get("format") != DRIVE_FORMAT:
            raise ConfigError(f"drive shard {file} is of format {fmt or labels.get('format')!r}; "
                              f"this specdrive reads {DRIVE_FORMAT!r}")
        where = {int(n): j for j, n in enumerate(arrays["frame_steps"])}
        cycles = []
        for c, (lab, n) in enumerate(zip(labels["cycles"], arrays["steps"])):
            count = int(arrays["agent_count"][c])
            frames = [where[int(n) - k] for k in FRAME_OFFSETS]
            cycles.append(Scene(arrays["history"][c], arrays["future"][c], lab["coc"], lab["coc_routine"],
                                lab["family"], lab["cause"], lab["decision"], lab["agents"],
                                arrays["agent_poses"][c][:count], split=self.split, seed=lab["seed"],
                                cause_kind=lab["cause_kind"], cause_facts=lab["cause_facts"], cycle=lab["cycle"],
                                time=lab["time"], unseen_family=lab["unseen_family"], roads=lab["roads"],
                                paint=lab["paint"], images=np.stack([arrays["images"][j] for j in frames], axis=1),
                                ids=np.stack([arrays["ids"][j] for j in frames], axis=1).astype(np.int16)))
        return Drive(labels["seed"], self.split, labels["family"], labels["seconds"], cycles,
                     arrays["ego_world"], arrays["steps"])


def load_drives(root, split: str = "test") -> DriveDataset:
    """The drives of one split of a `scenes generate --drives` directory."""
    return DriveDataset(root, split)
