"""The calibration set: the inputs every ONNX graph really sees, recorded while the fp32 graphs run
the planner loop (speculative decoding, verify widths 1..k+1, the action expert) on train scenes.

    calib = record(folder, meta, tokenizer, planner_cfg, scenes)    # folder: `specdrive export onnx`
    calib.save(folder / "calibration")                             # GRAPH.safetensors + index.json
    calib.sha256                                                   # goes into every quantized meta

One sample of a graph is a dict keyed by that graph's ONNX input names. The KV-reading graphs
(step, draft_feed, draft_chain) take the whole cache; a sample keeps its rows [0, start + n) and
`samples(graph)` pads them back with zeros (rows past start + n are masked out by the graph, so
their values change nothing). Per scene each graph keeps `per_scene` of its calls (default 1, at
a point of the cycle that moves from scene to scene: `spread`), so over a few hundred scenes
every decode position, verify width and Euler step appears. The vision tower, the draft's prefill
and the action expert keep samples of at most OTHER_CAP scenes: their inputs are large (images,
whole contexts) and do not vary along a cycle. 128 scenes at max_len 1024 make about 0.6 GB.
Scenes run
with the profile's k and, every other one, with k = k_max so the widest verify (k_max + 1 rows) is
in the set; the budget is off so every cycle decodes to its end.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from core.artifacts import EnginesMeta
from core.config import ConfigError, file_sha256, read_json
from core.graphs import DRAFT_CHAIN, DRAFT_FEED, IMAGE_BLOCKS, PREFILL, STEP, STEP_TREE, VISION, VISION_FRAME

CACHE_INPUTS = {"cache"}          # inputs that are the full KV cache (trimmed when recorded)
# the LLM graphs keep a sample from every scene; the others (vision, draft prefill, action expert:
# large inputs, few calls, no KV history) from OTHER_CAP scenes spread over the set
ALL_SCENES = (PREFILL, STEP, DRAFT_FEED, DRAFT_CHAIN)
OTHER_CAP = 64
INDEX = "index.json"
FORMAT = "specdrive-calibration"


@dataclass
class CalibrationSet:
    graphs: dict = field(default_factory=dict)      # graph -> [ {input name: array} ]
    scenes: list = field(default_factory=list)      # scene names, in order
    max_len: int = 0
    sha256: str = ""

    def samples(self, graph: str) -> list[dict]:
        """The graph's samples as its inputs: cache inputs padded back to max_len rows."""
        out = []
        for s in self.graphs.get(graph, []):
            full = {}
            for name, a in s.items():
                if name in CACHE_INPUTS and a.shape[-2] < self.max_len:
                    pad = np.zeros((*a.shape[:-2], self.max_len - a.shape[-2], a.shape[-1]), a.dtype)
                    a = np.concatenate([a, pad], -2)
                full[name] = a
            out.append(full)
        return out

    def save(self, folder: Path) -> dict:
        """GRAPH.safetensors (keys NNNN.input) + index.json; sets and returns the index."""
        folder.mkdir(parents=True, exist_ok=True)
        files = {}
        for graph, samples in sorted(self.graphs.items()):
            tensors = {f"{i:04d}.{name}": np.ascontiguousarray(a) for i, s in enumerate(samples)
                       for name, a in s.items()}
            save_file(tensors, str(folder / f"{graph}.safetensors"))
            files[graph] = {"file": f"{graph}.safetensors", "samples": len(samples),
                            "sha256": file_sha256(folder / f"{graph}.safetensors")}
        self.sha256 = digest(files, self.scenes, self.max_len)
        index = {"format": FORMAT, "format_version": 1, "scenes": self.scenes, "max_len": self.max_len,
                 "graphs": files, "sha256": self.sha256}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return index


def digest(files: dict, scenes: list, max_len: int) -> str:
    """The set's hash: over every graph file's name, sample count and hash, the scenes and max_len
    (an index edited by hand no longer matches it)."""
    body = {"graphs": {g: [f["file"], f["samples"], f["sha256"]] for g, f in sorted(files.items())},
            "scenes": scenes, "max_len": max_len}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def load(folder: Path) -> CalibrationSet:
    """A saved set, index.json checked whole (its hash covers every field) and each file
    against it; ConfigError naming what is wrong."""
    folder = Path(folder)
    where = folder / INDEX
    if not where.is_file():
        raise ConfigError(f"{folder}: no {INDEX}; not a calibration set (run `specdrive calibrate record`)")
    index = read_json(where, "calibration index")
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise ConfigError(f"{where}: format {got!r}, expected a {FORMAT!r} table")
    files, scenes, max_len = index.get("graphs"), index.get("scenes"), index.get("max_len")
    if not isinstance(files, dict) or not files or not all(
            isinstance(f, dict) and isinstance(f.get("file"), str) and type(f.get("samples")) is int
            and isinstance(f.get("sha256"), str) for f in files.values()):
        raise ConfigError(f"{where}: 'graphs' must map each graph to its file, samples and sha256; "
                          "record the calibration set again")
    if not isinstance(scenes, list) or type(max_len) is not int:
        raise ConfigError(f"{where}: 'scenes' (a list) and 'max_len' (an int) are needed; record the set again")
    if digest(files, scenes, max_len) != index.get("sha256"):
        raise ConfigError(f"{where}: its sha256 does not match its graphs, sample counts, scenes and max_len "
                          "(edited by hand?); record the calibration set again")
    return CalibrationSet({g: _samples(folder, g, f) for g, f in files.items()}, scenes, max_len, index["sha256"])


def _samples(folder: Path, graph: str, f: dict) -> list[dict]:
    """One graph's samples, its file checked: inside the folder, its hash, safetensors, and
    exactly samples 0000 .. samples-1 in it."""
    path = folder / f["file"]
    if Path(f["file"]).is_absolute() or not path.resolve().is_relative_to(folder.resolve()) or \
            not path.is_file() or file_sha256(path) != f["sha256"]:
        raise ConfigError(f"{path}: missing, outside the set or changed since it was recorded (sha256 in "
                          f"{INDEX}); record the calibration set again")
    try:
        flat = load_file(str(path))
    except Exception as e:          # safetensors raises its own error types for a foreign file
        raise ConfigError(f"{path}: not a safetensors file ({e}); record the calibration set again") from None
    n = f["samples"]
    samples = [{} for _ in range(max(n, 0))]
    for key, a in flat.items():
        i, _, name = key.partition(".")
        if not (i.isdigit() and int(i) < n and name):
            raise ConfigError(f"{path}: tensor {key!r} is not sample NNNN.input of {n} samples; "
                              "record the calibration set again")
        samples[int(i)][name] = a
    if n < 1 or not all(samples):
        raise ConfigError(f"{path}: {n} samples in {INDEX}, but the file holds {len({k.split('.')[0] for k in flat})}; "
                          "record the calibration set again")
    return samples


def spread(scene: int, per_scene: int, calls: int) -> list[int]:
    """Which of a scene's `calls` to keep: positions on a golden-ratio sequence over the scenes, so
    scene after scene lands at another point of the cycle (early, late, every width)."""
    if calls <= per_scene:
        return list(range(calls))
    frac = ((scene * per_scene + np.arange(per_scene)) * 0.6180339887498949) % 1.0
    return sorted({int(f * calls) for f in frac})


def frame_samples(vision_samples: list[dict], images: int) -> list[dict]:
    """The one-image vision graph's inputs, cut from the whole-cycle vision graph's: without reuse
    the planner never calls vision_frame, and a frame's patches are its own rows of the batch
    (images are encoded independently), so these are exactly what it would see."""
    out = []
    for sample in vision_samples:
        patches = sample["patches"]
        if len(patches) % images:
            raise ConfigError(f"calibration: {len(patches)} vision patches do not split into {images} images")
        out += [{"patches": np.array(chunk)} for chunk in np.split(patches, images)]
    return out


def tree_samples(step_samples: list[dict]) -> list[dict]:
    """The tree step graph's inputs, from the step graph's: a chain is the tree whose mask is
    causal, and step_tree on it computes what step computes (the planner calls step_tree only
    under spec.tree, which calibration's profile does not set)."""
    return [{**s, "tree": np.tril(np.ones((s["ids"].shape[1],) * 2, bool))} for s in step_samples]


def block_samples(prefill_samples: list[dict], image_token_id: int) -> list[dict]:
    """A frame_local export's image_blocks inputs, cut from the prefill graph's: each image block
    (<|vision_start|> pads <|vision_end|>) with its rows' cos/sin (attention inside a block sees
    only position differences) and its image's features (the planner calls image_blocks only
    under reuse.prefill, which calibration's profile does not set)."""
    out = []
    for s in prefill_samples:
        ids = s["ids"][0]
        pad = np.flatnonzero(ids == image_token_id)
        runs = np.split(pad, np.flatnonzero(np.diff(pad) != 1) + 1) if len(pad) else []
        if not runs or len({len(r) for r in runs}) != 1:
            raise ConfigError("calibration: the prefill's image blocks are not all of one size")
        P = len(runs[0])
        rows = [np.arange(r[0] - 1, r[-1] + 2) for r in runs]
        out.append({"ids": np.stack([ids[r] for r in rows]), "cos": np.stack([s["cos"][0, r] for r in rows]),
                    "sin": np.stack([s["sin"][0, r] for r in rows]),
                    "image_embeds": s["image_embeds"].reshape(len(runs), P, -1),
                    "deepstack": s["deepstack"].reshape(s["deepstack"].shape[0], len(runs), P, -1)})
    return out


def record(folder: Path, meta: EnginesMeta, tokenizer, planner_cfg, scenes, per_scene: int = 1,
           threads: int = 1, progress: bool = True) -> CalibrationSet:
    """Run the fp32 graphs of `folder` through the planner on `scenes`; keep what each graph saw."""
    from runtime.backends.onnxruntime import OrtBackend
    from runtime.planner import Planner

    if per_scene < 1:
        raise ConfigError(f"per_scene={per_scene}: at least one call per graph and scene")

    calls: dict = {}

    def keep(graph: str, inputs: dict) -> None:
        """A copy of every graph call's inputs (this scene's), the caches cut to the rows read."""
        kept = {}
        for name, value in inputs.items():
            a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            if name in CACHE_INPUTS:       # rows this call attends to: [0, start + n)
                a = a[..., :int(inputs["start"][0]) + inputs["ids"].shape[1], :]
            kept[name] = np.array(a)
        calls.setdefault(graph, []).append(kept)

    from calibration.report import offline_config

    backend = OrtBackend(folder, meta, "cpu", planner_cfg.max_len, threads)
    backend.watch_graphs = keep
    planners = [Planner(backend, tokenizer, offline_config(planner_cfg)),
                Planner(backend, tokenizer, offline_config(planner_cfg, planner_cfg.spec.k_max))]
    out = CalibrationSet(max_len=backend.max_len)
    stride = -(-len(scenes) // OTHER_CAP)
    try:
        for i, scene in enumerate(tqdm(scenes, desc="calibration: recording graph inputs", disable=not progress)):
            calls.clear()
            planners[i % 2].plan(scene.images, scene.history, scene=scene.name)
            for graph, graph_calls in calls.items():
                if graph in ALL_SCENES or i % stride == 0:
                    out.graphs.setdefault(graph, []).extend(graph_calls[j] for j in spread(i, per_scene, len(graph_calls)))
            out.scenes.append(scene.name)
    finally:
        for p in planners:
            p.close()
    if VISION_FRAME in meta.graphs and VISION_FRAME not in out.graphs and VISION in out.graphs:
        out.graphs[VISION_FRAME] = frame_samples(out.graphs[VISION], len(planner_cfg.cameras) * planner_cfg.frames)
    if STEP_TREE in meta.graphs and STEP_TREE not in out.graphs and STEP in out.graphs:
        out.graphs[STEP_TREE] = tree_samples(out.graphs[STEP])
    if IMAGE_BLOCKS in meta.graphs and IMAGE_BLOCKS not in out.graphs and PREFILL in out.graphs:
        out.graphs[IMAGE_BLOCKS] = block_samples(out.graphs[PREFILL], meta.target.image_token_id)
    missing = sorted(set(meta.graphs) - set(out.graphs))
    if missing:
        raise ConfigError(f"calibration: the planner never called {missing} on {len(scenes)} scenes; "
                          "use more scenes or a planner profile that reaches them")
    return out
