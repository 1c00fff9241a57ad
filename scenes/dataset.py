"""Datasets of scenes: shards of safetensors (arrays) + JSON (text and labels), and their loader.

Layout of a dataset directory:
    manifest.json                       what was generated, splits, shard list (no timestamps)
    <split>/shard-00000.safetensors     history, future, images, ids (int8 on disk), agent_poses, agent_count
    <split>/shard-00000.json            per scene: seed, family, cause, decision, coc, flags, agents

Scene i of a split has the seed SeedSequence([seed, split number, i]); a shard holds a fixed
range of indices, so the bytes do not depend on how many workers wrote them.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import multiprocessing as mp
import queue as queue_lib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from core.artifacts import Table
from core.config import check_range
from scenes.config import (CAMERAS, DECISIONS, DRIVE_SECONDS, DT, FAMILIES, FRAME_OFFSETS, FUT_WAYPOINTS,
                           HIST_POSES, LIMITS, MAX_DRIVE_SECONDS, MAX_DRIVES, N_STEPS, SPLIT_FRACTIONS, SPLITS, TIMES, UNSEEN_FAMILY, ConfigError,
                           check_families)
from scenes.render import IMAGE_H, IMAGE_W
from scenes.world import Drive, Scene, make_drive, make_scene, pick_family

FORMAT = "specdrive-scenes-v2"     # world v2: snapshots are cycles of drives; the v2 language
DRIVE_FORMAT = "specdrive-drives-v2"
WHAT = {FORMAT: "scenes", DRIVE_FORMAT: "drives"}
MAKE = {FORMAT: "specdrive scenes generate", DRIVE_FORMAT: "specdrive scenes generate --drives N"}
MAX_AGENTS = 16                  # agent_poses is padded with NaN to this many agents (ids fit int8)
MAX_SCENES = 1_000_000           # --n at most
MAX_WORKERS = 256
MAX_SHARD_SIZE = 65_536
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
    split: str | None = None      # write only this split's share of the n (the scenes a whole run writes there)

    def __post_init__(self):
        check_int("n", self.n, 1, MAX_SCENES, "scenes")
        if self.split is not None and self.split not in SPLITS:
            raise ConfigError(f"split={self.split!r} is not a split; splits are {', '.join(SPLITS)}")
        check_int("workers", self.workers, 1, MAX_WORKERS)
        check_int("shard_size", self.shard_size, 1, MAX_SHARD_SIZE)
        check_int("seed", self.seed, 0, 2 ** 32 - 1)
        check_out(self.out, FORMAT)
        object.__setattr__(self, "families", check_families(self.families))
        if set(self.families) == {UNSEEN_FAMILY}:
            raise ConfigError(f"families={list(self.families)}: {UNSEEN_FAMILY!r} is held out (split 'unseen' "
                              f"only); name at least one of {', '.join(f for f in FAMILIES if f != UNSEEN_FAMILY)}")


def check_int(name: str, value, lo: int, hi: int, what: str = "") -> None:
    """An int in [lo, hi], or a ConfigError saying the bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name}={value!r} must be an integer{' number of ' + what if what else ''} "
                          f"in [{lo}, {hi}]")
    check_range(name, int(value), lo=lo, hi=hi)


def check_out(out, fmt: str) -> None:
    """The folder a generate writes: new, or a folder holding nothing or a dataset of the same kind
    (a drives folder is never written over a snapshot dataset, nor the other way round)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; give a folder (new, or one holding {WHAT[fmt]})")
    file = out / "manifest.json"
    if file.is_file():
        try:
            got = json.loads(file.read_text()).get("format")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            got = None
        if got != fmt:
            raise ConfigError(f"--out {str(out)!r} already holds a dataset of format {got!r}; {WHAT[fmt]} "
                              f"({fmt!r}) would replace its manifest: give another folder, or remove it first")


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
    if cfg.split is not None:
        if not counts.get(cfg.split):
            raise ConfigError(f"--split {cfg.split}: {cfg.n} scenes over {', '.join(counts)} give it none; "
                              "raise --n")
        counts = {cfg.split: counts[cfg.split]}
    jobs = [(cfg, split, k, start, min(start + cfg.shard_size, count))
            for split, count in counts.items() for k, start in enumerate(range(0, count, cfg.shard_size))]
    for split in counts:
        (out / split).mkdir(parents=True, exist_ok=True)
        for old in (out / split).glob("shard-*"):       # shards of an earlier run in this directory
            if re.fullmatch(r"shard-\d{5}\.(safetensors|json)", old.name):
                old.unlink()
    results = _run(jobs, cfg.workers, sum(counts.values()), progress)
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
    sha256: dict | None = None      # drives: {"safetensors": hex, "json": hex} of its two files


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
                file, count = _inside(root, t("file", str), where, t.prefix), t(size, int)
                parts.append(Part(file, count, _shard_hashes(t, where, fmt)))
            if fmt == DRIVE_FORMAT and entry("count", int) != len(parts):
                raise ConfigError(f"{where}: field 'splits.{split}.count' = {entry('count', int)} but "
                                  f"'splits.{split}.drives' lists {len(parts)}; regenerate it with `{MAKE[fmt]}`")
            splits[split], counts[split] = tuple(parts), entry("count", int)
        return cls(Path(root), fmt, splits, counts)


def _shard_hashes(t: Table, where: str, fmt: str) -> dict | None:
    """A drive entry's {"safetensors": sha256, "json": sha256} (required: drives are checked whole)."""
    if fmt != DRIVE_FORMAT:
        return None
    if "sha256" not in t.data:
        raise ConfigError(f"{where}: field '{t.prefix}sha256' is missing: this drives folder was written by "
                          f"an older specdrive, before each drive's files were hashed; regenerate it with "
                          f"`{MAKE[fmt]}` (the same seed gives the same drives)")
    sha = t.table("sha256")
    out = {}
    for ext in SHARD_FILES:
        value = sha(ext, str)
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ConfigError(f"{where}: field '{sha.prefix}{ext}' = {value!r} is not a sha256 (64 hex digits)")
        out[ext] = value
    return out


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
        check_int("drives", self.drives, 1, MAX_DRIVES, "drives")
        check_range("seconds", self.seconds, lo=DT, hi=MAX_DRIVE_SECONDS)     # at least one 0.1 s cycle
        check_int("workers", self.workers, 1, MAX_WORKERS)
        check_int("seed", self.seed, 0, 2 ** 32 - 1)
        check_out(self.out, DRIVE_FORMAT)
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
    sha = {ext: file_sha256(Path(cfg.out) / f"{name}.{ext}") for ext in SHARD_FILES}
    return {"split": split, "file": name, "family": drive.family, "cycles": len(drive.cycles), "seed": seed,
            "sha256": sha}


SHARD_FILES = ("safetensors", "json")     # the two files of a drive shard, each hashed in manifest.json


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
        entry = self.entries[i]
        file = self.root / entry.file
        labels, arrays = read_drive_shard(file, entry)
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

    def check(self) -> None:
        """Read and check every drive of the split (ConfigError on the first bad one)."""
        for entry in self.entries:
            read_drive_shard(self.root / entry.file, entry)


# a drive shard's label fields: name -> JSON type (float: a finite number, never a bool)
CYCLE_FIELDS = {"coc": str, "coc_routine": list, "family": str, "cause": (int, type(None)), "decision": str,
                "agents": list, "seed": int, "cause_kind": str, "cause_facts": dict, "cycle": int, "time": float,
                "unseen_family": bool, "roads": list, "paint": list}
RESTAMP = "regenerate it with `specdrive scenes generate --drives N`"


def read_drive_shard(file: Path, entry: Part) -> tuple[dict, dict]:
    """(labels, arrays) of one drive shard, checked whole against its manifest entry: both files'
    sha256, the format of each, every label field's type, every array's name, dtype and shape,
    cycles = label cycles = array rows, times finite and increasing in steps of DT and on the
    grid's time of each step, every frame a cycle needs present. ConfigError names the file and
    the field."""
    paths = {ext: file.with_name(file.name + "." + ext) for ext in SHARD_FILES}
    for ext, path in paths.items():
        if not path.is_file():
            raise ConfigError(f"drive shard {path} is missing; {RESTAMP}")
        got = file_sha256(path)
        if entry.sha256 is not None and got != entry.sha256[ext]:
            raise ConfigError(f"drive shard {path}: sha256 {got[:16]}... differs from the manifest's "
                              f"field 'sha256.{ext}' ({entry.sha256[ext][:16]}...): the file was changed or "
                              f"belongs to another folder; {RESTAMP}")
    try:
        labels = json.loads(paths["json"].read_text())
        with safe_open(str(paths["safetensors"]), framework="numpy") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys()}
            fmt = (f.metadata() or {}).get("format")
    except Exception as e:           # truncated or foreign files: say which and what to do
        raise ConfigError(f"drive shard {file} is unreadable ({type(e).__name__}: {e}); {RESTAMP}") from None
    if fmt != DRIVE_FORMAT:
        raise ConfigError(f"drive shard {paths['safetensors']}: metadata field 'format' = {fmt!r}; this "
                          f"specdrive reads {DRIVE_FORMAT!r}; {RESTAMP}")
    where = str(paths["json"])
    got = labels.get("format") if isinstance(labels, dict) else None
    if got != DRIVE_FORMAT:
        raise ConfigError(f"{where}: field 'format' = {got!r}" + ("" if isinstance(labels, dict) else
                          f" (the file is a {type(labels).__name__}, not a table)") +
                          f"; this specdrive reads {DRIVE_FORMAT!r}; {RESTAMP}")
    t = Table(labels, where)
    t("seed", int), t("family", str), _finite(t, "seconds")
    rows = t("cycles", list)
    for c, row in enumerate(rows):
        r = Table(row, where, f"cycles[{c}].")
        for name, kind in CYCLE_FIELDS.items():
            _finite(r, name) if kind is float else r(name, kind)
    n = entry.count
    if len(rows) != n:
        raise ConfigError(f"{where}: field 'cycles' holds {len(rows)} cycles, the manifest's entry "
                          f"{entry.file!r} says {n}; {RESTAMP}")
    _check_arrays(paths["safetensors"], arrays, n)
    steps = arrays["steps"].astype(np.int64)
    times = np.array([row["time"] for row in rows], dtype=np.float64)
    if n > 1 and not (np.diff(steps) == 1).all():
        raise ConfigError(f"{paths['safetensors']}: array 'steps' is not one grid step per cycle, increasing; "
                          f"{RESTAMP}")
    if not np.allclose(times, TIMES[steps], atol=1e-6):
        c = int(np.argmax(~np.isclose(times, TIMES[steps], atol=1e-6)))
        raise ConfigError(f"{where}: field 'cycles[{c}].time' = {float(times[c])!r} is not the time of its grid step "
                          f"{int(steps[c])} ({TIMES[steps[c]]:.3f} s): times must increase by {DT} s a cycle; "
                          f"{RESTAMP}")
    frames = set(int(x) for x in arrays["frame_steps"])
    need = sorted({int(s) - k for s in steps for k in FRAME_OFFSETS} - frames)
    if need or not (np.diff(arrays["frame_steps"]) > 0).all():
        raise ConfigError(f"{paths['safetensors']}: array 'frame_steps' " + (
            f"lacks the grid steps {need[:4]} that cycles need" if need else "is not increasing") + f"; {RESTAMP}")
    return labels, arrays


def _finite(t: Table, name: str) -> float:
    value = t(name, float)
    if not math.isfinite(value):
        raise ConfigError(f"{t.where}: field {t.prefix + name!r} = {value!r} is not a finite number; {RESTAMP}")
    return value


def _check_arrays(path: Path, arrays: dict, n: int) -> None:
    """Every array of a drive shard by name, dtype and shape (n cycles, F frames, the cameras and
    image size of this world)."""
    cams = len(CAMERAS)
    f = arrays["frame_steps"].shape[0] if "frame_steps" in arrays and arrays["frame_steps"].ndim == 1 else None
    want = {"images": (np.uint8, (f, cams, IMAGE_H, IMAGE_W, 3)), "ids": (np.int8, (f, cams, IMAGE_H, IMAGE_W)),
            "frame_steps": (np.int32, (f,)), "steps": (np.int32, (n,)), "ego_world": (np.float32, (N_STEPS, 3)),
            "history": (np.float32, (n, HIST_POSES, 3)), "future": (np.float32, (n, FUT_WAYPOINTS, 3)),
            "agent_poses": (np.float32, (n, MAX_AGENTS, 80, 3)), "agent_count": (np.int32, (n,))}
    names = sorted(arrays)
    if set(names) != set(want):
        missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
        raise ConfigError(f"{path}: arrays {names}; " + (f"missing {missing}" if missing else "") +
                          (", " if missing and extra else "") + (f"unknown {extra}" if extra else "") +
                          f"; a drive shard holds exactly {sorted(want)}; {RESTAMP}")
    for name, (dtype, shape) in want.items():
        a = arrays[name]
        if a.dtype != dtype or a.shape != shape:
            raise ConfigError(f"{path}: array {name!r} is {a.dtype} {tuple(a.shape)}, expected {np.dtype(dtype)} "
                              f"{shape} ({n} cycles in the manifest); {RESTAMP}")
    count = arrays["agent_count"]
    if ((count < 0) | (count > MAX_AGENTS)).any():
        raise ConfigError(f"{path}: array 'agent_count' has values outside [0, {MAX_AGENTS}]; {RESTAMP}")
    steps = arrays["steps"].astype(np.int64)
    lo = HIST_POSES - 1 + max(FRAME_OFFSETS)
    if n and (steps.min() < lo or steps.max() + FUT_WAYPOINTS >= N_STEPS):
        raise ConfigError(f"{path}: array 'steps' leaves the time grid; allowed {lo}..{N_STEPS - 1 - FUT_WAYPOINTS}; "
                          f"{RESTAMP}")
    for name in ("history", "future", "ego_world"):
        if not np.isfinite(arrays[name]).all():
            raise ConfigError(f"{path}: array {name!r} holds values that are not finite; {RESTAMP}")


def load_drives(root, split: str = "test") -> DriveDataset:
    """The drives of one split of a `scenes generate --drives` directory."""
    return DriveDataset(root, split)
