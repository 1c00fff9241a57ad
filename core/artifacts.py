"""The identity cards of every artifact, typed once: a folder's meta.json (checkpoints of kind
target / draft / expert / planner, an exported "engines" folder, a TensorRT-LLM checkpoint) and an
engines folder's manifest.json, each parsed into frozen dataclasses where it is read. A missing or
malformed field is a ConfigError naming the file and the field; nothing downstream reads a key.

Each card's JSON is declared here only: a writer builds the card (`new`, from typed values) and
calls its `write(folder)`; a reader parses the same card (`from_dict`, `read_*`); `to_dict()` gives
its JSON back. The facts hash (`facts_sha256`) covers an exported meta.json so a loader names the
one field edited by hand. Standard library and numpy only: models/, export/, engines/, calibration/ and runtime/ all
read artifacts here.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ConfigError, read_json
from core.graphs import DRAFT_CHAIN, DRAFT_FEATURES, DRAFT_FEED, DRAFT_PREFILL, FEATS, IMAGE_ATTENTION, IMAGE_BLOCKS, \
    OPTIONAL, VISION, VISION_FRAME, graph_io, required_graphs

META = "meta.json"
MANIFEST = "manifest.json"
CHECKPOINT_FORMAT = "specdrive-checkpoint"
CHECKPOINT_VERSION = 1
MODEL_KINDS = ("target", "draft", "expert", "planner")
ONNX_FORMAT = "specdrive-onnx"          # an exported folder (meta.json kind "engines")
ONNX_VERSION = 1                        # export/onnx.py writes it, the graph backends read it
OPSET = 18
MANIFEST_FORMAT = "specdrive-engines-manifest"
TRTLLM_FORMAT = "specdrive-trtllm-checkpoint"
VERIFY_WIDTHS = "dynamic width axis T: one step graph serves prefill rows and widths 1..k_max+1"
ACTION_LOOP = "host: one action_velocity call per Euler step, then action_output"
TARGET_ONLY = ("vocab_size", "image_token_id", "image_attention")     # LlmDims fields a draft's meta.json omits
_MISSING = object()


class Table:
    """Typed reads of one JSON table: each failure a ConfigError naming the file and the field."""

    def __init__(self, data, where: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: {prefix.rstrip('.') or 'the file'} is {data!r}, not a table")
        self.data, self.where, self.prefix = data, where, prefix

    def __call__(self, key: str, kind=object, default=_MISSING):
        name = self.prefix + key
        if key not in self.data:
            if default is _MISSING:
                raise ConfigError(f"{self.where}: field {name!r} is missing")
            return default
        value = self.data[key]
        if default is not _MISSING and value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else \
            isinstance(value, int) and not isinstance(value, bool) if kind is int else isinstance(value, kind)
        if not ok:
            raise ConfigError(f"{self.where}: field {name!r} = {value!r} is not {getattr(kind, '__name__', kind)}")
        return value

    @classmethod
    def of_format(cls, data, where: str, fmt: str) -> Table:
        """`data` once its "format" is `fmt`; else a ConfigError saying which format it has."""
        got = data.get("format") if isinstance(data, dict) else None
        if got != fmt:
            raise ConfigError(f"{where}: format {got!r}, expected {fmt!r}")
        return cls(data, where)

    def table(self, key: str, default=_MISSING) -> Table:
        return Table(self(key, dict, default), self.where, f"{self.prefix}{key}.")


class Card:
    """A parsed JSON table; `raw` is the JSON it was parsed from. FILE: the file it is written as."""
    raw: dict
    FILE = META

    def to_dict(self) -> dict:
        """The JSON this was parsed from (a copy): what a writer edits and writes back."""
        return copy.deepcopy(self.raw)

    def write(self, folder) -> Path:
        """FOLDER/FILE: this card's JSON, keys sorted, indented 2 (the bytes every writer writes)."""
        file = Path(folder) / self.FILE
        file.write_text(json.dumps(self.raw, indent=2, sort_keys=True) + "\n")
        return file


# --- exported graphs: meta.json kind "engines" ------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple                    # ints and named dynamic axes ("T")
    dtype: str | None


@dataclass(frozen=True)
class Graph(Card):
    """One graph of an export: its file (relative to the folder), hash, inputs and outputs."""
    file: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    precision: str = "fp32"
    quantization: dict | None = None        # calibration's record of a quantized graph
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, file: str, sha256: str, inputs: tuple, outputs: tuple) -> Graph:
        """An exported graph's entry: its file, hash and TensorSpecs (fp32, not quantized)."""
        raw = {"file": file, "sha256": sha256, "inputs": _specs(inputs), "outputs": _specs(outputs)}
        return cls(file, sha256, tuple(inputs), tuple(outputs), raw=raw)

    def dims(self, name: str, side: str = "inputs") -> list | None:
        """The declared shape of an input (or output) by name; None when there is none."""
        return next((list(t.shape) for t in getattr(self, side) if t.name == name), None)


@dataclass(frozen=True)
class LlmDims:
    """A decoder's dimensions as exported (target: with its vocabulary and image token)."""
    head_dim: int
    rope_theta: float
    mrope_section: tuple
    interleaved: bool
    layers: int
    kv_heads: int
    hidden: int
    vocab_size: int | None = None
    image_token_id: int | None = None
    image_attention: str = "causal"     # target: models LLMConfig.image_attention (older exports: causal)


@dataclass(frozen=True)
class PromptShapes:
    cameras: int
    frames: int
    image_hw: tuple
    grid_thw: list                  # (images, 3) patch grid of one cycle's images
    image_tokens: int | None = None


@dataclass(frozen=True)
class VisionDims:
    patch: int
    temporal_patch: int
    merge: int


@dataclass(frozen=True)
class ActionShapes:
    euler_steps: int
    samples: int                    # draws action_output combines (fixed in the graph)
    combine: str
    n_waypoints: int
    action_dim: int


@dataclass(frozen=True)
class DraftVocab:
    """A reduced draft head's map (draft id -> target id), applied in the graphs or on the host."""
    n: int
    map: str
    d2t: tuple
    d2t_sha256: str | None

    @classmethod
    def from_dict(cls, dv: dict, where: str) -> DraftVocab | None:
        """meta.json's draft_vocab ({} for a full head: None)."""
        if not dv:
            return None
        if dv.get("map") not in ("graph", "host") or not isinstance(dv.get("d2t"), list) or \
                len(dv["d2t"]) != dv.get("n"):
            raise ConfigError(f"{where}: draft_vocab needs n, map ('graph' or 'host') and a d2t list "
                              f"of n ids; found map {dv.get('map')!r}, n {dv.get('n')!r}")
        return cls(dv["n"], dv["map"], tuple(dv["d2t"]), dv.get("d2t_sha256"))

    def to_dict(self) -> dict:
        return {"n": self.n, "map": self.map, "d2t": list(self.d2t), "d2t_sha256": self.d2t_sha256}


@dataclass(frozen=True)
class ExportSource:
    """Where an export came from: the checkpoint folder and each model's module hashes at export."""
    checkpoint: str
    models: dict                    # {kind: {"folder": str, "modules": {module: sha256}}}

    @classmethod
    def from_dict(cls, source) -> ExportSource | None:
        """meta.json's source; None when it is not one (it is informational, outside the facts
        hash: an edit there must not refuse the folder, only its stamp)."""
        if not isinstance(source, dict) or not isinstance(source.get("checkpoint"), str):
            return None
        models = source.get("models", {})
        if not isinstance(models, dict) or not all(
                isinstance(m, dict) and isinstance(m.get("folder"), str) and isinstance(m.get("modules"), dict)
                for m in models.values()):
            return None
        return cls(source["checkpoint"], models)


@dataclass(frozen=True)
class EnginesMeta(Card):
    """An exported folder's meta.json (kind "engines"): its graphs and the facts they follow from."""
    folder: Path
    backend: str
    max_len: int
    k_max: int
    draft: str
    draft_features: str
    draft_rope: str
    tokenizer_sha256: str | None
    precision: dict                 # {graph or "*": precision}
    prompt: PromptShapes
    vision: VisionDims
    target: LlmDims
    draft_llm: LlmDims
    action: ActionShapes
    graphs: dict                    # {name: Graph}
    fp32_graphs: dict | None        # {name: Graph}: the reference graphs, where calibration switched
    draft_vocab: DraftVocab | None
    calibration_sha256: str | list | None = None    # the calibration set(s) of its quantized graphs
    source: ExportSource | None = None
    kind: str = "engines"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, folder, *, max_len: int, k_max: int, draft: str, draft_features: str, draft_rope: str,
            feature_layers: list, tokenizer_sha256: str, prompt: PromptShapes, vision: VisionDims, target: LlmDims,
            draft_llm: LlmDims, action: ActionShapes, graphs: dict, draft_vocab: DraftVocab | None,
            source: ExportSource, model_config: dict, torch: str, created_at: str) -> EnginesMeta:
        """The card of a fresh export into FOLDER (fp32 graphs {name: Graph} run by onnxruntime),
        its facts stamped; model_config the models' config as exported, torch the exporter's version."""
        meta = {"format": ONNX_FORMAT, "format_version": ONNX_VERSION, "kind": "engines", "backend": "onnxruntime",
                "created_at": created_at, "torch": torch, "opset": OPSET, "precision": {"*": "fp32"},
                "max_len": max_len, "k_max": k_max, "verify_widths": VERIFY_WIDTHS, "draft": draft,
                "draft_features": draft_features, "draft_rope": draft_rope, "feature_layers": list(feature_layers),
                "source": {"checkpoint": source.checkpoint, "models": source.models},
                "tokenizer_sha256": tokenizer_sha256, "prompt": _plain(prompt), "vision": _plain(vision),
                "target": _plain(target),
                "draft_llm": {k: v for k, v in _plain(draft_llm).items() if k not in TARGET_ONLY},
                "action": {"loop": ACTION_LOOP, **_plain(action)}, "model_config": model_config,
                "graphs": {name: g.to_dict() for name, g in graphs.items()},
                "draft_vocab": draft_vocab.to_dict() if draft_vocab else {}}
        return cls.from_dict(stamp_facts(meta), folder)

    @classmethod
    def from_dict(cls, meta: dict, folder) -> EnginesMeta:
        """Checked whole: format, version, opset, the graph list the draft needs, every graph file
        inside the folder, the declared names and shapes against core/graphs.py and the facts
        they follow from (image size -> patches, draft features -> feature widths)."""
        where = f"{folder}/{META}"
        f = Table(meta, where)
        if meta.get("format") != ONNX_FORMAT:
            raise ConfigError(f"{where}: format {meta.get('format')!r}; expected {ONNX_FORMAT!r} graphs")
        for key, want in (("format_version", ONNX_VERSION), ("opset", OPSET)):
            got = meta.get(key)
            if type(got) is not int or got != want:
                raise ConfigError(f"{where}: {key} {got!r}; this runtime reads {key} {want} (re-export the folder)")
        if not isinstance(meta.get("graphs"), dict):
            raise ConfigError(f"{where}: no 'graphs' table (each graph's file, sha256, inputs and outputs); "
                              "re-export the folder")
        features = meta.get("draft_features")
        if features not in DRAFT_FEATURES:
            raise ConfigError(f"{where}: draft_features {features!r}; allowed {list(DRAFT_FEATURES)}")
        graphs = _graphs(meta["graphs"], Path(folder), where, features, check_set=True)
        precision = meta.get("precision")
        if not isinstance(precision, dict):
            raise ConfigError(f"{where}: precision {precision!r}; expected a table {{graph or '*': precision}}")
        fp32 = meta.get("fp32_graphs")
        card = cls(folder=Path(folder), backend=f("backend", str), max_len=f("max_len", int), k_max=f("k_max", int),
                   draft=f("draft", str), draft_features=features, draft_rope=f("draft_rope", str),
                   tokenizer_sha256=f("tokenizer_sha256", str, None), precision=precision,
                   prompt=_prompt(f.table("prompt")), vision=_vision(f.table("vision")),
                   target=_llm(f.table("target"), target=True), draft_llm=_llm(f.table("draft_llm")),
                   action=_action(f.table("action")),
                   graphs=graphs, fp32_graphs=_graphs(fp32, Path(folder), where, features) if fp32 else None,
                   draft_vocab=DraftVocab.from_dict(f("draft_vocab", dict, {}), where),
                   calibration_sha256=f("calibration_sha256", (str, list), None),
                   source=ExportSource.from_dict(meta.get("source")), raw=meta)
        _check_declared_shapes(where, card)
        return card

    def reference(self) -> EnginesMeta:
        """This export with its fp32 graphs (calibration keeps them in fp32_graphs once it switched
        the folder to the quantized ones)."""
        if not self.fp32_graphs:
            return self
        return EnginesMeta.from_dict({**self.raw, "graphs": self.raw["fp32_graphs"]}, self.folder)


def _graphs(table, folder: Path, where: str, features: str, check_set: bool = False) -> dict:
    if check_set:
        want = set(required_graphs(features))
        if set(table) - set(OPTIONAL) != want:
            raise ConfigError(f"{where}: graphs {sorted(table)}; a draft_features={features!r} export has exactly "
                              f"{sorted(want)} (missing {sorted(want - set(table))}, unknown "
                              f"{sorted(set(table) - want - set(OPTIONAL))}; optional {list(OPTIONAL)})")
    root, out = folder.resolve(), {}
    for name, g in table.items():
        if not isinstance(g, dict) or not all(k in g for k in ("file", "sha256", "inputs", "outputs")):
            raise ConfigError(f"{where}: graph {name!r} needs 'file', 'sha256', 'inputs' and 'outputs'")
        file = g["file"]
        if not isinstance(file, str) or Path(file).is_absolute() or \
                not (root / file).resolve().is_relative_to(root):
            raise ConfigError(f"{where}: graph {name!r} file {file!r} is outside the folder; a graph file "
                              "is a path relative to the folder, inside it")
        _check_io_names(where, name, g, features)
        f = Table(g, where, f"graphs.{name}.")
        out[name] = Graph(file, f("sha256", str), *(_tensors(g[side], where, f"graphs.{name}.{side}")
                                                    for side in ("inputs", "outputs")),
                          precision=f("precision", str, "fp32"), quantization=f("quantization", dict, None), raw=g)
    return out


def _specs(tensors) -> list:
    """TensorSpecs as meta.json lists them (the inverse of _tensors)."""
    return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in tensors]


def _tensors(specs: list, where: str, prefix: str) -> tuple:
    out = []
    for i, t in enumerate(specs):
        f = Table(t, where, f"{prefix}[{i}].")
        out.append(TensorSpec(f("name", str), tuple(f("shape", list)), f("dtype", str, None)))
    return tuple(out)


def _check_io_names(where: str, name: str, graph: dict, features: str) -> None:
    """A graph's declared input and output names are the ones core/graphs.py declares."""
    want = graph_io(name, features)
    for side, names in (("inputs", want.inputs), ("outputs", want.outputs)):
        got = tuple(t.get("name") if isinstance(t, dict) else None for t in graph[side] or ())
        if got != names:
            raise ConfigError(f"{where}: graph {name!r} {side} {list(got)}; this runtime binds {list(names)} "
                              "(the folder was exported by another version: re-export it)")


def _prompt(f: Table) -> PromptShapes:
    return PromptShapes(f("cameras", int), f("frames", int), tuple(f("image_hw", list)), f("grid_thw", list),
                        f("image_tokens", int, None))


def _vision(f: Table) -> VisionDims:
    return VisionDims(f("patch", int), f("temporal_patch", int), f("merge", int))


def _llm(f: Table, target: bool = False) -> LlmDims:
    return LlmDims(f("head_dim", int), f("rope_theta", float), tuple(f("mrope_section", list)),
                   f("interleaved", bool), f("layers", int), f("kv_heads", int), f("hidden", int),
                   f("vocab_size", int) if target else None, f("image_token_id", int) if target else None,
                   f("image_attention", str, "causal") if target else "causal")


def _action(f: Table) -> ActionShapes:
    """The exported expert's settings, each in the range the planner profile allows (ExpertRequest)."""
    def ranged(key: str, lo: int, hi: int) -> int:
        value = f(key, int)
        if not lo <= value <= hi:
            raise ConfigError(f"{f.where}: field '{f.prefix}{key}' = {value} is out of range; allowed [{lo}, {hi}]")
        return value
    return ActionShapes(ranged("euler_steps", 1, 100), ranged("samples", 1, 64), f("combine", str),
                        ranged("n_waypoints", 1, 1 << 12), ranged("action_dim", 1, 16))


def patch_shapes(n: int, hw, patch: int, temporal_patch: int, merge: int) -> tuple[list, list]:
    """The shape of the patches of n RGB images of hw = (H, W) and their grid_thw, as
    prompt.pixels.images_to_patches makes them (no pixels needed: the arithmetic only)."""
    H, W = hw
    if H % (patch * merge) or W % (patch * merge):
        raise ValueError(f"image size {H}x{W} must be divisible by patch*merge={patch * merge}")
    gh, gw = H // patch, W // patch
    return [n * gh * gw, 3 * temporal_patch * patch * patch], [[1, gh, gw]] * n

def _check_declared_shapes(where: str, meta: EnginesMeta) -> None:
    p, v, t, d, graphs = meta.prompt, meta.vision, meta.target, meta.draft_llm, meta.graphs
    images = p.cameras * p.frames
    try:
        patches, grid = patch_shapes(images, p.image_hw, v.patch, v.temporal_patch, v.merge)
    except ValueError as e:
        raise ConfigError(f"{where}: prompt.image_hw {list(p.image_hw)}: {e}") from None
    if grid != p.grid_thw:
        raise ConfigError(f"{where}: prompt.image_hw {list(p.image_hw)} x {p.cameras} cameras x {p.frames} "
                          f"frames gives the patch grid {grid[:1]}..., but grid_thw is "
                          f"{p.grid_thw[:1]}...: the graphs were exported for another image size")
    wants = [(VISION, "patches", list(patches))]
    if VISION_FRAME in graphs:
        wants.append((VISION_FRAME, "patches", [patches[0] // images, patches[1]]))
    if t.image_attention not in IMAGE_ATTENTION:
        raise ConfigError(f"{where}: field 'target.image_attention' = {t.image_attention!r}; allowed {list(IMAGE_ATTENTION)}")
    if IMAGE_BLOCKS in graphs and t.image_attention != "frame_local":
        raise ConfigError(f"{where}: graph {IMAGE_BLOCKS!r} streams the prefill of a frame_local target, but "
                          f"target.image_attention is {t.image_attention!r}: the graphs are of another target")
    fused = meta.draft_features == "fused"
    for graph in (DRAFT_FEED, DRAFT_PREFILL):
        if (graphs[graph].dims(FEATS) is not None) != fused:
            raise ConfigError(f"{where}: draft_features {meta.draft_features!r} but graph {graph!r} "
                              f"{'has no' if fused else 'has a'} 'feats' input: the graphs are of another draft")
    if fused:
        wants += [(DRAFT_FEED, FEATS, [1, "T", 3 * t.hidden]),
                  (DRAFT_CHAIN, FEATS, [1, "T", d.hidden])]
    for graph, inp, shape in wants:
        got = graphs[graph].dims(inp)
        if got != shape:
            raise ConfigError(f"{where}: graph {graph!r} input {inp!r} is declared {got}, but the meta.json facts "
                              f"give {shape}: declarations that do not fit the graphs")


# --- checkpoints: meta.json kind target / draft / expert / planner ---------------------------------
@dataclass(frozen=True)
class ModuleFile:
    """One module's safetensors file: its hash, size and every tensor's shape and dtype."""
    file: str
    sha256: str
    bytes: int | None
    tensors: dict                   # {name: TensorSpec}

    def to_dict(self) -> dict:
        """meta.json's entry of the module."""
        return {"file": self.file, "sha256": self.sha256, "bytes": self.bytes,
                "tensors": {k: {"shape": list(t.shape), "dtype": t.dtype} for k, t in self.tensors.items()}}


@dataclass(frozen=True)
class CheckpointMeta(Card):
    """A specdrive checkpoint's meta.json (models/io.py writes it)."""
    folder: Path
    kind: str
    config_class: str
    config: dict
    modules: dict                   # {module: ModuleFile}
    dtype: str | None
    variant: str | None             # a draft's name (flat, mrope, ...)
    draft_vocab: int                # a reduced draft head's rows (0: full)
    d2t_sha256: str | None
    tokenizer_sha256: str | None
    extra: dict                     # what the writer added (source, stage, versions, created_by, ...)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, folder, kind: str, config_class: str, config: dict, dtype: str, modules: dict,
            extra: dict) -> CheckpointMeta:
        """The card of a checkpoint saved to FOLDER: modules {name: ModuleFile}; extra the writer's
        own fields (versions, created_by, created_at, source, stage, variant, ...)."""
        meta = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, "kind": kind,
                "config_class": config_class, "config": config, "dtype": dtype,
                "modules": {name: m.to_dict() for name, m in modules.items()}, **extra}
        return cls.from_dict(meta, folder)

    @classmethod
    def from_dict(cls, meta: dict, folder) -> CheckpointMeta:
        """Refused unless a checkpoint this code reads: format, version, kind, config, modules."""
        file = f"{folder}/{META}"
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"{file}: format is not {CHECKPOINT_FORMAT!r}")
        if meta.get("format_version") != CHECKPOINT_VERSION:
            raise ConfigError(f"{file}: format_version {meta.get('format_version')!r}; this code reads "
                              f"{CHECKPOINT_VERSION}")
        if meta.get("kind") not in MODEL_KINDS:
            raise ConfigError(f"{file}: unknown kind {meta.get('kind')!r}; allowed kinds are {list(MODEL_KINDS)}")
        for key in ("config", "config_class", "modules"):
            if key not in meta:
                raise ConfigError(f"{file}: missing key {key!r}")
        f = Table(meta, file)
        modules = {}
        for name, entry in f("modules", dict).items():
            m = Table(entry, file, f"modules.{name}.")
            tensors = {k: TensorSpec(k, tuple(t.get("shape", ())), t.get("dtype"))
                       for k, t in m("tensors", dict).items()}
            modules[name] = ModuleFile(m("file", str), m("sha256", str), m("bytes", int, None), tensors)
        known = {"format", "format_version", "kind", "config", "config_class", "modules", "dtype", "variant",
                 "draft_vocab", "d2t_sha256", "tokenizer_sha256"}
        return cls(Path(folder), meta["kind"], f("config_class", str), f("config", dict), modules,
                   f("dtype", str, None), f("variant", str, None), f("draft_vocab", int, 0),
                   f("d2t_sha256", str, None), f("tokenizer_sha256", str, None),
                   {k: v for k, v in meta.items() if k not in known}, raw=meta)


def _read(folder) -> dict:
    """FOLDER/meta.json as a dict with a "kind"; ConfigError naming the file otherwise."""
    file = Path(folder) / META
    if not file.is_file():
        raise ConfigError(f"{folder}: no {META}; not a specdrive artifact")
    meta = read_json(file, "artifact metadata")
    if not isinstance(meta, dict) or "kind" not in meta:
        raise ConfigError(f"{file}: no 'kind'; cannot tell what this artifact is")
    return meta


def read_meta(folder) -> CheckpointMeta | EnginesMeta:
    """FOLDER/meta.json by its kind: a checkpoint, or an exported folder (its facts hash checked
    before anything else: every field as exported)."""
    meta = _read(folder)
    return _engines(meta, folder) if meta["kind"] == "engines" else CheckpointMeta.from_dict(meta, folder)


def read_engines_meta(folder) -> EnginesMeta:
    """An exported folder's meta.json; ConfigError when FOLDER holds another kind of artifact."""
    meta = _read(folder)
    if meta["kind"] != "engines":
        raise ConfigError(f"{folder}/{META}: kind {meta['kind']!r} backend {meta.get('backend')!r}; "
                          "expected kind 'engines' (an export: `specdrive export onnx` or `engines build`)")
    return _engines(meta, folder)


def _engines(meta: dict, folder) -> EnginesMeta:
    check_facts(meta, f"{folder}/{META}")
    return EnginesMeta.from_dict(meta, folder)


def scan_checkpoints(folder) -> tuple[dict[str, Path], dict[str, Path]]:
    """({kind: folder} for target / expert / planner, {variant: folder} for drafts) from the
    meta.json of DIR and its direct subfolders. A draft is named by its meta.json "variant"
    (flat, mrope, flat-standalone, flat-aarl, ...), else its folder name, as a label only."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"checkpoint folder {str(folder)!r} does not exist")
    models: dict[str, Path] = {}
    drafts: dict[str, Path] = {}
    for cand in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        if not (cand / META).is_file():
            continue
        meta = _read(cand)
        kind = meta["kind"]
        if meta.get("format") != CHECKPOINT_FORMAT or kind not in MODEL_KINDS:
            raise ConfigError(f"{cand}/{META}: format {meta.get('format')!r} kind {kind!r} "
                              f"is not a specdrive model checkpoint (kinds {list(MODEL_KINDS)})")
        label = str(meta.get("variant") or cand.name) if kind == "draft" else kind
        table = drafts if kind == "draft" else models
        if label in table:
            raise ConfigError(f"{folder}: two checkpoints of kind {kind!r} named {label!r} "
                              f"({table[label]} and {cand}); keep one")
        table[label] = cand
    if "planner" not in models and "target" not in models:
        raise ConfigError(f"{folder}: no target checkpoint (meta.json kind 'target' or 'planner'); "
                          f"found kinds {sorted(models) + (['draft'] if drafts else [])}")
    return models, drafts


# --- TensorRT-LLM checkpoints (engines/trtllm.py): meta.json without a kind ------------------------
@dataclass(frozen=True)
class TrtllmMeta(Card):
    role: str
    files: dict                     # {file: sha256}
    source: str | None
    source_sha256: dict
    calibration: dict | None
    cannot_build_at_release: list
    draft_vocab: dict | None
    trtllm_release: str | None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def new(cls, folder, role: str, files: dict, release: str, source: str | None = None, source_sha256=None,
            calibration: dict | None = None, cannot_build_at_release=(),
            draft_vocab: tuple | None = None) -> TrtllmMeta:
        """The card of a checkpoint written to FOLDER; draft_vocab (n, d2t sha256) for a reduced draft
        head, whose lm_head rows outside d2t the writer zeroes."""
        meta = {"format": TRTLLM_FORMAT, "trtllm_release": release, "role": role, "source": source,
                "source_sha256": dict(source_sha256 or {}), "calibration": calibration,
                "cannot_build_at_release": list(cannot_build_at_release), "files": files}
        if draft_vocab is not None:
            meta["draft_vocab"] = {"n": draft_vocab[0], "d2t_sha256": draft_vocab[1], "off_head":
                                   "lm_head rows outside d2t are zero; the runtime bans them as bad words"}
        return cls.from_dict(meta, folder)

    @classmethod
    def from_dict(cls, meta: dict, folder) -> TrtllmMeta:
        f = Table.of_format(meta, f"{folder}/{META}", TRTLLM_FORMAT)
        return cls(f("role", str), f("files", dict), f("source", str, None), f("source_sha256", dict, {}),
                   f("calibration", dict, None), f("cannot_build_at_release", list, []), f("draft_vocab", dict, None),
                   f("trtllm_release", str, None), raw=meta)


# --- an engines build's manifest.json (engines/build.py writes it) ---------------------------------
@dataclass(frozen=True)
class BuildShapes:
    max_prompt: int
    max_len: int
    k_max: int
    cameras: int
    frames: int
    image_hw: tuple
    verify_widths: tuple
    tree_widths: tuple = ()         # step_tree's profiles (builds before token trees: none)


@dataclass(frozen=True)
class FileHash:
    file: str                       # relative to the folder
    sha256: str


@dataclass(frozen=True)
class EngineFile(FileHash):
    tensorrt: str | None = None     # the TensorRT version that built it ("trtexec": unknown)


@dataclass(frozen=True)
class TrtllmBuild:
    """The manifest's "trtllm" entry: TensorRT-LLM checkpoints written, engines built on the device."""
    release: str | None
    build_script: str
    checkpoints: dict               # {role: {dir, quant_algo, architecture, cannot_build_at_release}}
    status: str | None
    calibration: dict | None

    def blockers(self) -> dict:
        """{role: the features that block its build at the release} for the roles that have any."""
        return {role: c.get("cannot_build_at_release") for role, c in self.checkpoints.items()
                if c.get("cannot_build_at_release")}


@dataclass(frozen=True)
class Manifest(Card):
    folder: Path
    profile: str
    built: bool
    planner: str | None
    target_sm: int | None
    tensorrt_range: tuple
    shapes: BuildShapes
    precision: dict                 # {graph: engine precision}
    int4_awq: bool
    graphs: dict                    # {graph: FileHash of the ONNX file built from}
    onnx_meta_sha256: str | None
    engines: dict                   # {graph: EngineFile}
    trtllm: TrtllmBuild | None
    calibration: dict
    steps: dict
    needs: dict
    tools: dict                     # {package: version} of the build machine
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    FILE = MANIFEST

    @classmethod
    def new(cls, folder, *, profile: str, built: bool, steps: dict, device: str, target_sm: int | None,
            platform: str, tensorrt_range: list, planner: str | None, checkpoint: str, shapes: dict,
            precision: dict, int4_awq: bool, calibration: dict, graphs: dict, onnx_meta_sha256: str, tools: dict,
            created_at: str, install: str = "", engines: dict | None = None, trtllm: dict | None = None) -> Manifest:
        """The card of a build into FOLDER: graphs {graph: Graph or FileHash} it was built from,
        engines {graph: EngineFile} where built (else `needs` says TensorRT and how to `install` it),
        trtllm the TensorRT-LLM checkpoints' entry where written."""
        m = {"format": MANIFEST_FORMAT, "format_version": 1, "profile": profile, "built": built, "steps": steps,
             "device": device, "target_sm": target_sm, "platform": platform, "tensorrt_range": list(tensorrt_range),
             "planner": planner, "checkpoint": checkpoint, "shapes": shapes, "precision": precision,
             "int4_awq": int4_awq, "calibration": calibration,
             "graphs": {n: {"file": g.file, "sha256": g.sha256} for n, g in graphs.items()},
             "onnx_meta_sha256": onnx_meta_sha256, "tools": tools, "created_at": created_at}
        if not built:
            m["needs"] = {"step": "build", "what": "TensorRT (the `tensorrt` Python package or trtexec)",
                          "install": install}
        if engines:
            m["engines"] = {g: _plain(e) for g, e in engines.items()}
        if trtllm:
            m["trtllm"] = trtllm
        return cls.from_dict(m, folder)

    @classmethod
    def from_dict(cls, m: dict, folder) -> Manifest:
        where = f"{folder}/{MANIFEST}"
        f = Table.of_format(m, where, MANIFEST_FORMAT)
        s = f.table("shapes")
        shapes = BuildShapes(s("max_prompt", int), s("max_len", int), s("k_max", int), s("cameras", int),
                             s("frames", int), tuple(s("image_hw", list)), tuple(s("verify_widths", list)),
                             tuple(s("tree_widths", list, [])))
        engines = {}
        for g, e in f("engines", dict, {}).items():
            t = Table(e, where, f"engines.{g}.")
            engines[g] = EngineFile(t("file", str), t("sha256", str), t("tensorrt", str, None))
        graphs = {}
        for g, e in f("graphs", dict, {}).items():
            t = Table(e, where, f"graphs.{g}.")
            graphs[g] = FileHash(t("file", str), t("sha256", str))
        trtllm = None
        if m.get("trtllm"):
            t = f.table("trtllm")
            trtllm = TrtllmBuild(t("release", str, None), t("build_script", str, "trtllm/BUILD.sh"),
                                 t("checkpoints", dict, {}), t("status", str, None), t("calibration", dict, None))
        return cls(Path(folder), f("profile", str), f("built", bool), f("planner", str, None),
                   f("target_sm", int, None), tuple(f("tensorrt_range", list, [])), shapes, f("precision", dict, {}),
                   f("int4_awq", bool, False), graphs, f("onnx_meta_sha256", str, None), engines, trtllm,
                   f("calibration", dict, {}), f("steps", dict, {}), f("needs", dict, {}), f("tools", dict, {}),
                   raw=m)


def _plain(entry) -> dict:
    """A typed entry (a dataclass such as EngineFile) or a table, as its JSON table (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(entry) if dataclasses.is_dataclass(entry) else entry))


def read_manifest(folder, backend: str | None = None) -> Manifest:
    """FOLDER/manifest.json of `specdrive engines build`. With `backend` (the runtime opening the
    folder) it must list built engines: a `built: false` manifest says what the build needs and
    where to run it."""
    file = Path(folder) / MANIFEST
    if backend is not None and not file.is_file():
        raise ConfigError(f"--backend {backend}: {folder} has no manifest.json; build the engines on the "
                          "device with `make engines PROFILE=...` (specdrive engines build)")
    m = read_json(file, "engines manifest")
    if backend is not None and isinstance(m, dict) and m.get("format") == MANIFEST_FORMAT and not m.get("built"):
        here = "" if importlib.util.find_spec("tensorrt") else \
            "; the 'tensorrt' Python package is not installed here either"
        raise ConfigError(f"--backend {backend}: {folder} holds no engines yet (manifest.json built: false, "
                          f"profile {m.get('profile')!r}: the build needs TensorRT){here}. Engines are built on "
                          f"the device they run on: install TensorRT there ({m.get('needs', {}).get('install')}), "
                          f"then run `make engines PROFILE={m.get('profile')}` there")
    return Manifest.from_dict(m, folder)


# --- the facts of an artifact's meta.json, covered by a hash -------------------------------------
FACTS = "facts_sha256"
NOT_FACTS = ("created_at", "source", FACTS)      # informational: an edit there is harmless


def facts(meta: dict, prefix: str = "") -> dict[str, object]:
    """{dotted field: value} of every leaf of meta.json a loader may act on (lists are leaves)."""
    out = {}
    for key, value in meta.items():
        if not prefix and key in NOT_FACTS:
            continue
        if isinstance(value, dict) and value:
            out.update(facts(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def facts_sha256(meta: dict) -> dict[str, str]:
    """{dotted field: sha256 of its canonical JSON, 16 hex digits}: what a writer stores under
    "facts_sha256", so a loader can name the one field edited by hand."""
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:16]
            for k, v in facts(meta).items()}


def stamp_facts(meta: dict) -> dict:
    """meta with its facts_sha256 (re)computed; a writer calls it last."""
    return {**{k: v for k, v in meta.items() if k != FACTS}, FACTS: facts_sha256(meta)}


def check_facts(meta: dict, where) -> None:
    """ConfigError naming the first field of meta.json that differs from what its writer
    hashed (edited, added or removed); created_at and source are free."""
    want = meta.get(FACTS)
    if not isinstance(want, dict):
        raise ConfigError(f"{where}: no {FACTS} (written before meta.json was hashed, or removed): "
                          "its fields cannot be trusted; re-export the folder")
    got = facts_sha256(meta)
    for key in sorted(set(want) | set(got)):
        if key not in got:
            raise ConfigError(f"{where}: field {key!r} is missing (it was exported); re-export the folder")
        if key not in want:
            raise ConfigError(f"{where}: field {key!r} = {facts(meta)[key]!r} was added by hand (no export "
                              "writes it); remove it or re-export the folder")
        if got[key] != want[key]:
            raise ConfigError(f"{where}: field {key!r} = {facts(meta)[key]!r} was edited (it does not match "
                              f"its {FACTS}); restore the exported value or re-export the folder")


# --- a folder's fingerprint: what a rewrite of its cards cannot forge --------------------------------
CARDS = (META, MANIFEST)
BESIDE = ("tokenizer.json", "config.json")   # read with the cards, named by none of them (config.json:
                                              # a Hugging Face tokenizer's release config, read beside it)
SHARD_EXTS = (".safetensors", ".json")  # a dataset's "file" names a shard's pair of files
RELEASE_MODEL_TYPE = "alpamayo_r1"      # an Alpamayo-R1 release: config.json model_type at its root


def folder_fingerprint(folder) -> str:
    """sha256 over a folder's cards (meta.json, manifest.json, at its top and in its direct
    subfolders), the files beside them (tokenizer.json, config.json) and every file a card names
    (any "file" field, a "files" table's keys; a dataset's "file" names its .safetensors and
    .json): one line "path<TAB>sha256 of the bytes" per file, sorted. Editing any of them, the
    facts and their hashes together included, changes it; so a fingerprint pinned apart from the
    folder (a planner profile, --expect-fingerprint) refuses a rewritten folder. A folder with no
    card (a released Alpamayo-R1 folder) is fingerprinted over every file in it; one that is both
    (cards and a release's config.json) is refused: a loader would run what the hash left out."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"{str(root)!r} is not a folder; nothing to fingerprint")
    base = root.resolve()
    cards = cards_of(root)
    check_one_kind(root, cards)
    files = {c for c in cards} | {root / b for b in BESIDE if (root / b).is_file()}
    for card in cards:
        for name in _named(read_json(card, "artifact card")):
            files |= _resolve(card, name, base)
    if not cards:
        files = {p for p in root.rglob("*") if p.is_file()}
    lines = sorted(f"{_inside(p, root, base)}\t{_sha256(p)}\n" for p in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def cards_of(root: Path) -> list[Path]:
    """The cards (meta.json, manifest.json) at the top of `root` and in its direct subfolders."""
    return [d / c for d in [root, *sorted(p for p in root.iterdir() if p.is_dir())] for c in CARDS
            if (d / c).is_file()]


def is_release_config(folder) -> bool:
    """Whether FOLDER/config.json is an Alpamayo-R1 release's (model_type alpamayo_r1)."""
    file = Path(folder) / "config.json"
    if not file.is_file():
        return False
    config = read_json(file, "model config")
    return isinstance(config, dict) and config.get("model_type") == RELEASE_MODEL_TYPE


def check_one_kind(root: Path, cards: list[Path]) -> None:
    """ConfigError when `root` is two kinds at once: specdrive cards and a release at its root."""
    if cards and is_release_config(root):
        named = ", ".join(str(c.relative_to(root)) for c in cards[:3]) + (", ..." if len(cards) > 3 else "")
        raise ConfigError(f"{root} is two kinds at once: a specdrive folder (cards {named}) and an "
                          f"Alpamayo-R1 release (config.json model_type {RELEASE_MODEL_TYPE!r} at its root); "
                          "one loader would run what the other's fingerprint leaves out. Allowed: one kind "
                          "per folder; move the release files or the specdrive checkpoints to a folder of "
                          "their own")


def _inside(path: Path, root: Path, base: Path) -> str:
    """`path`'s name relative to the folder, or a ConfigError when it resolves outside (a link)."""
    target = path.resolve()
    if not target.is_relative_to(base):
        raise ConfigError(f"{path} links outside {root} (to {target}); every file a folder's loaders "
                          "read must lie inside it: copy the file into the folder instead of linking it")
    return target.relative_to(base).as_posix()


def _named(data) -> list:
    """Every file name a card holds: "file" values and the keys of a "files" table, at any depth."""
    out = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "file" and isinstance(value, str):
                out.append(value)
            elif key == "files" and isinstance(value, dict):
                out += [k for k in value if isinstance(k, str)]
            else:
                out += _named(value)
    elif isinstance(data, list):
        for value in data:
            out += _named(value)
    return out


def _resolve(card: Path, name: str, base: Path) -> set:
    path = card.parent / name
    found = [path] if path.is_file() else [path.with_name(path.name + e) for e in SHARD_EXTS
                                           if path.with_name(path.name + e).is_file()]
    if not found:
        raise ConfigError(f"{card}: names the file {name!r}, which is missing; the folder is incomplete")
    for p in found:
        if Path(name).is_absolute() or not p.resolve().is_relative_to(base):
            raise ConfigError(f"{card}: names the file {name!r}, outside the folder; a card names files "
                              "inside its own folder")
    return set(found)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_fingerprint_text(value, name: str = "--expect-fingerprint"):
    """A pinned fingerprint: 64 lowercase hex digits (as `specdrive plan` prints it), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ConfigError(f"{name}={value!r} is not a fingerprint; allowed 64 lowercase hex digits, as "
                          "`specdrive plan`, `bench` and `drive` print it at start")
    return value


def pinned_fingerprint(folder, *pins, what: str = "folder") -> str:
    """The folder's fingerprint, or a ConfigError when any pin (name, value) given differs from it."""
    got = folder_fingerprint(folder)
    for name, want in pins:
        if want is not None and check_fingerprint_text(want, name) != got:
            raise ConfigError(f"{what} {str(folder)!r} has the fingerprint {got}, not the {want} pinned by "
                              f"{name}: a file of it was changed (its meta.json, a weight, a graph, a shard) "
                              "or it is another folder; run the folder that was pinned, or check this one "
                              "and pin its fingerprint")
    return got
