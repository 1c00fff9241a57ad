"""Grids of training cells that build up across sessions: each finished cell's result is kept in a
committed folder, and a session runs the next unfinished cells.

    specdrive train grid --config configs/grids/aarl-power.yaml [--max-cells N] [--budget-min M] [--status]

A grid (GridConfig, configs/grids/*.yaml) is a stage (aarl or distill), a base config of that
stage, overrides for every cell, and groups; a group's cells are the product of its axes
(dotted config keys -> values). Cell names read their settings: "anchor-steps400-lr2e-05-seed1".

    RESULTS/<grid>/<cell>/draft-<variant>/   the cell's final draft (safetensors + meta.json), unless
                                             keep_weights is false (metrics.json then holds its sha256)
    RESULTS/<grid>/<cell>/metrics.json       stamp (the target's sha256, the planner folder's
                                             fingerprint, commit, command), the cell's overrides,
                                             the last row of its training log, wall time, scores

A cell is finished when its metrics.json (of this FORMAT) records the current target's sha256 and
the cell's overrides; anything else (missing, another target, other settings) is run again. A cell trains
in WORK/<grid>/<cell> (the stage's resumable run folder), is scored, and is written to
RESULTS/<grid>/.<cell>.tmp, which is renamed into place last: a half-trained or half-written cell
is never in RESULTS. Scores (GridScore) are greedy tau of the cell's draft (and, for AARL, of its
initial draft) on fixed scenes, with the per-scene (tokens, passes) records train.claims'
seed-then-scene intervals read, and for AARL the reward of `aarl.score_draft` on the same scenes.
"""
from __future__ import annotations

import itertools
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from models import io
from core.config import ConfigError, check_choice, check_range, file_sha256, load_yaml
from core.stamp import results_stamp
from scenes import dataset
from train import aarl, ckpt, config, data, distill, evaluate, loop, reasoning
from train.teachers import build_teachers

STAGES = ("aarl", "distill")
FORMAT = 1          # of a cell's metrics.json: a result of another format is run again
SEED_KEYS = ("run.seed", "seeds")   # the override that names a cell's training seed (aarl, distill)


@dataclass
class GridScore:
    split: str = "heldout"
    scenes: int = 100
    k: int = 8
    batch: int = 16
    aarl_reward: bool = True       # aarl grids: also the AARL reward on the same scenes (the expert's cost)

    def __post_init__(self):
        config.DataConfig(split=self.split)
        check_range("score.scenes", self.scenes, lo=1)
        check_range("score.k", self.k, lo=1, hi=16)
        check_range("score.batch", self.batch, lo=1)


@dataclass
class GridConfig:
    name: str = ""
    stage: str = "aarl"
    base: str = "configs/train/aarl.yaml"   # the stage's config every cell starts from
    planner: str = "checkpoints/tiny"       # the planner folder whose target every cell trains against
    set: tuple[str, ...] = ()               # "key=value" overrides of every cell
    groups: dict = field(default_factory=dict)   # name -> {set: [...], axes: {dotted key: [values]}}
    score: GridScore = field(default_factory=GridScore)
    results: str = "results/grids"          # committed: finished cells only
    work: str = "runs/grid"                 # run folders of cells in training (not committed)
    max_cells: int = 0                      # cells this call runs at most; 0 = all unfinished
    budget_min: float = 0.0                 # no cell starts when the mean cell time would pass it; 0 = none
    keep_weights: bool = True               # commit each cell's draft (about 1 MB); false: its metrics and
                                            # the trained file's sha256 only (the tracked tree stays small
                                            # enough to travel to a device machine, tests/test_structure.py)

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise ConfigError(f"name {self.name!r}: a grid needs a name (a folder name, no '/')")
        check_choice("stage", self.stage, STAGES)
        check_range("max_cells", self.max_cells, lo=0)
        check_range("budget_min", self.budget_min, lo=0.0)
        if not self.groups:
            raise ConfigError("groups: a grid needs at least one group of cells")
        for g, spec in self.groups.items():
            bad = set(spec or {}) - {"set", "axes"}
            if bad or not isinstance((spec or {}).get("axes", {}), dict):
                raise ConfigError(f"groups.{g}: a group holds 'set' (a list of key=value) and 'axes' "
                                  f"({{dotted key: [values]}}); found {sorted(spec or {})}")


@dataclass(frozen=True)
class Cell:
    name: str
    overrides: tuple[str, ...]     # the grid's, the group's, then the axes' (run.out excluded)


def cells(grid: GridConfig) -> list[Cell]:
    """Every cell of the grid, in config order (groups, then the axes' product, last axis fastest)."""
    out = []
    for g, spec in grid.groups.items():
        spec = spec or {}
        axes = spec.get("axes") or {}
        for values in itertools.product(*[axes[k] for k in axes]):
            label = "-".join(_label(k, v) for k, v in zip(axes, values))
            sets = (*grid.set, *(spec.get("set") or ()), *(f"{k}={_yaml(v)}" for k, v in zip(axes, values)))
            out.append(Cell(f"{g}-{label}" if label else g, tuple(str(s) for s in sets)))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"grid {grid.name}: two cells share a name ({sorted(n for n in names if names.count(n) > 1)})")
    return out


def _yaml(value) -> str:
    """A value as YAML reads it back: a float keeps a '.' in its mantissa (YAML 1.1 reads 2e-05 as text)."""
    text = repr(value) if isinstance(value, float) else str(value)
    mant, e, exp = text.partition("e")
    return f"{mant}.0e{exp}" if isinstance(value, float) and e and "." not in mant else text


def _label(key: str, value) -> str:
    """A cell name's part for one axis: the key's last part and the value, brackets and spaces dropped."""
    text = f"{key.split('.')[-1]}{value}"
    return "".join(ch for ch in text if ch.isalnum() or ch in "._+-")


def finished(grid: GridConfig, cell: Cell, target_sha: str) -> bool:
    """Whether RESULTS/<grid>/<cell>/metrics.json is this cell's, for the current target."""
    f = Path(grid.results) / grid.name / cell.name / "metrics.json"
    if not f.is_file():
        return False
    m = json.loads(f.read_text())
    return m.get("format") == FORMAT and m.get("target_sha256") == target_sha and \
        tuple(m.get("overrides", ())) == cell.overrides


def stage_config(grid: GridConfig, cell: Cell):
    """The stage config of `cell`, training in WORK/<grid>/<cell>; the planner is the grid's."""
    work = Path(grid.work) / grid.name / cell.name
    cfg = config.load(grid.stage, grid.base, (f"target={grid.planner}", *cell.overrides, f"run.out={work}"))
    if grid.stage == "distill" and (len(cfg.drafts) != 1 or len(cfg.seeds) != 1):
        raise ConfigError(f"cell {cell.name}: a distill cell trains one draft of one seed; it sets "
                          f"drafts={list(cfg.drafts)} seeds={list(cfg.seeds)}")
    return cfg


def run_cell(grid: GridConfig, cell: Cell, target_sha: str, train_fn=None, score_fn=None) -> Path:
    """Train, score and commit one cell -> its results folder. train_fn(cfg) -> (draft folder,
    init draft folder or None); score_fn(grid, cfg, draft, init) -> scores (tests pass doubles)."""
    cfg = stage_config(grid, cell)
    t0, earlier = time.monotonic(), _earlier_wall(Path(cfg.run.out))
    draft, init = (train_fn or _train)(grid.stage, cfg)
    scores = (score_fn or score)(grid, cfg, draft, init)
    metrics = {"format": FORMAT, "stamp": results_stamp(grid.planner), "target_sha256": target_sha, "grid": grid.name,
               "cell": cell.name, "stage": grid.stage, "overrides": list(cell.overrides),
               "wall_s": round(earlier + time.monotonic() - t0, 1), "resumed_after_s": round(earlier, 1),
               "log": _last_log(Path(cfg.run.out)), "scores": scores,
               "weights": {"kept": grid.keep_weights,
                           "sha256": {f.name: file_sha256(f) for f in sorted(Path(draft).glob("*.safetensors"))}}}
    final = Path(grid.results) / grid.name / cell.name
    tmp = final.parent / f".{cell.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if grid.keep_weights:
        shutil.copytree(draft, tmp / Path(draft).name)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    shutil.rmtree(final, ignore_errors=True)          # a stale result (other target or settings)
    tmp.rename(final)
    return final


def _train(stage: str, cfg):
    if stage == "aarl":
        return aarl.run(cfg), cfg.draft
    return distill.run(cfg)[0], None


def _earlier_wall(run: Path) -> float:
    """Seconds earlier processes spent training this cell (a cell resumed in a later session):
    its training log restarts elapsed_s at each process, so each run of rows where elapsed_s
    grows is one process, ended at its last row (at most one log interval short of the kill)."""
    f = run / "log.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    total, last = 0.0, None
    for r in rows:
        t = float(r.get("elapsed_s", 0.0))
        if last is not None and t < last:
            total += last
        last = t
    return total + (last or 0.0)


def _last_log(run: Path) -> dict:
    f = run / "log.jsonl"
    lines = f.read_text().splitlines() if f.is_file() else []
    return json.loads(lines[-1]) if lines else {}


def score(grid: GridConfig, cfg, draft, init) -> dict:
    """Greedy tau at score.k of the cell's draft (and of its initial draft) on the first
    score.scenes scenes of score.split, with the cell's position gap; for AARL also the reward."""
    s, dev = grid.score, loop.device(cfg.run.device)
    tok, model_cfg, target, expert = io.load_planner(grid.planner)
    target.to(dev)
    expert.to(dev)
    drafts = {"draft": io.load_draft(draft, model_cfg, target)[1].to(dev)}
    if init is not None:
        drafts["init"] = io.load_draft(init, model_cfg, target)[1].to(dev)
    exs = data.load_examples(config.DataConfig(dir=cfg.data.dir, split=s.split, max_scenes=s.scenes), tok,
                             model_cfg.target.vision)
    toks = []
    for b in range(0, len(exs), s.batch):
        t, n = reasoning.greedy_reasoning(target, exs[b:b + s.batch], tok, cfg.max_new_tokens)
        toks += [t[i, :n[i]].numpy() for i in range(len(n))]
    with_r = [reasoning.with_reasoning(e, t, tok) for e, t in zip(exs, toks)]
    layers = tuple(next(iter(drafts.values())).cfg.feature_layers) or tuple(model_cfg.draft.feature_layers)
    teachers = build_teachers(target, with_r, layers, s.batch)
    ends = [t.first + evaluate.routine_tokens(tok, tok.decode(w[w != tok.cot_end]).split())
            for t, w in zip(teachers, toks)]
    gap = getattr(cfg, "position_gap", 0)
    out = {"split": s.split, "scenes": len(exs), "k": s.k, "position_gap": gap}
    for name, d in drafts.items():
        nums = evaluate.draft_numbers(d, teachers, tok, s.k, ends, gap=gap)
        out[name] = {k: nums[k] for k in ("tau", "tau_routine", "tau_commitment", "alpha", "free_running")}
        out[name]["per_scene"] = [{"n": r["n"], "f": r["f"]} for r in nums["per_scene"]]   # train.claims' intervals
    if grid.stage == "aarl" and s.aarl_reward:
        scenes = dataset.load(cfg.data.dir, s.split)
        items = [(e, scenes[int(e.index)]) for e in exs]
        for name, d in drafts.items():
            out[name]["reward"] = aarl.score_draft(d, target, expert, items, tok, cfg)
    return out


def run(grid: GridConfig, train_fn=None, score_fn=None, status_only: bool = False) -> str:
    """Run the next unfinished cells (max_cells, budget_min); -> a status line."""
    target_sha = ckpt.target_sha256(grid.planner)
    todo = [c for c in cells(grid) if not finished(grid, c, target_sha)]
    total = len(cells(grid))
    line = f"grid {grid.name}: {total - len(todo)}/{total} cells finished"
    if status_only or not todo:
        return f"{line}; summary {write_summary(grid, target_sha)}"
    if grid.max_cells:
        todo = todo[:grid.max_cells]
    t0, walls = time.monotonic(), _walls(grid)
    bar = tqdm(todo, desc=grid.name, unit="cell")
    done = 0
    for cell in bar:
        guess = float(np.mean(walls)) if walls else 0.0
        if grid.budget_min and (time.monotonic() - t0 + guess) / 60 > grid.budget_min:
            bar.write(f"{cell.name}: not started (a cell takes ~{guess / 60:.1f} min; budget {grid.budget_min} min)")
            break
        bar.set_postfix_str(cell.name)
        t = time.monotonic()
        run_cell(grid, cell, target_sha, train_fn, score_fn)
        walls.append(time.monotonic() - t)
        done += 1
    left = sum(not finished(grid, c, target_sha) for c in cells(grid))
    write_summary(grid, target_sha)
    return f"grid {grid.name}: {done} cells run now, {total - left}/{total} cells finished"


def split_seed(cell: Cell) -> tuple[str, int]:
    """(the cell's setting: its name less the seed part, its training seed): the seed of an aarl cell
    is run.seed, of a distill cell its one seed (`seeds=[N]`)."""
    for o in reversed(cell.overrides):
        key, _, value = o.partition("=")
        if key in SEED_KEYS:
            seed = int(value.strip("[] "))
            part = f"-{key.split('.')[-1]}{seed}"
            return (cell.name[: -len(part)] if cell.name.endswith(part) else cell.name), seed
    return cell.name, 0


def summary_path(grid: GridConfig) -> Path:
    return Path(grid.work) / grid.name / "summary.json"


def write_summary(grid: GridConfig, target_sha: str) -> Path:
    """WORK/<grid>/summary.json: every finished cell's metrics (the current target's) with the
    cell's setting (its name less the seed) and seed, in config order, under a stamp of the
    grid's planner; what `specdrive report` renders docs/claims.md's grid table from (and cuts
    results/<grid>.json from)."""
    every, rows = cells(grid), []
    for c in every:
        if finished(grid, c, target_sha):
            m = json.loads((Path(grid.results) / grid.name / c.name / "metrics.json").read_text())
            setting, seed = split_seed(c)
            rows.append({"cell": c.name, "setting": setting, "seed": seed, "wall_s": m.get("wall_s"),
                         "log": m.get("log", {}), "scores": m["scores"], "stamp": m.get("stamp")})
    setting_sets = {}
    for c in every:          # each setting's overrides, the seed's left out: what a table reads its axes from
        setting, seed = split_seed(c)
        setting_sets.setdefault(setting, [o for o in c.overrides if o.partition("=")[0] not in SEED_KEYS])
    out = {"stamp": results_stamp(grid.planner), "grid": grid.name, "stage": grid.stage, "cells_total": len(every),
           "settings": list(setting_sets), "setting_overrides": setting_sets, "cells": rows}
    f = summary_path(grid)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(out, indent=1) + "\n")
    return f


def _walls(grid: GridConfig) -> list[float]:
    """Wall times of the grid's finished cells (the budget's estimate of the next one)."""
    root = Path(grid.results) / grid.name
    return [json.loads(f.read_text()).get("wall_s", 0.0) for f in sorted(root.glob("*/metrics.json"))]


def load(path, overrides=()) -> GridConfig:
    return load_yaml(GridConfig, path, overrides=tuple(overrides))
