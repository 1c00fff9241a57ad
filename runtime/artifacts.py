"""What the planner is given: checkpoints and engine folders, identified by their meta.json.

A checkpoint folder (`--checkpoint DIR`) holds the tokenizer (tokenizer.json) and one or more
specdrive checkpoints, each a folder with a meta.json whose `kind` says what it is (target,
draft, expert, or planner = all in one); DIR itself may be one. Folder names are never read
for meaning. An engines folder (`--engines DIR`) has a meta.json with kind "engines" and the
backend that runs it. A released Alpamayo-R1 folder (config.json with model_type
"alpamayo_r1", sharded safetensors, a Hugging Face tokenizer.json) runs as it is, with no
meta.json: what it is comes from its own config.json. Anything else is refused with a
ConfigError saying what was found.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.config import ConfigError
from core.artifacts import (cards_of, check_fingerprint_text, check_one_kind, is_release_config, pinned_fingerprint, read_engines_meta, read_manifest,
                              read_meta, scan_checkpoints)
from prompt.tokenizer import load_tokenizer as read_tokenizer
from runtime.backend import BACKENDS, BackendSpec, load_backend

ENGINE_BACKENDS = ("tensorrt", "tensorrt-llm")     # run the engines manifest.json lists


def is_release(folder: Path) -> bool:
    """An Alpamayo-R1 release folder: config.json says model_type alpamayo_r1 and no card is
    there (a folder with both is refused: check_one_kind)."""
    folder = Path(folder)
    if not is_release_config(folder):
        return False
    check_one_kind(folder, cards_of(folder))
    return True


DEFAULT_DRAFT = "flat"   # the draft variant a checkpoint folder runs with unless --draft says


def find_checkpoints(folder: Path, draft: str | None = None) -> dict[str, Path]:
    """{kind: folder} with at most one "draft": the variant named `draft`, else DEFAULT_DRAFT
    when there are several, else the only one ("none", "self" or a path: no draft from here)."""
    models, drafts = scan_checkpoints(folder)
    if draft is None and drafts:
        draft = DEFAULT_DRAFT if len(drafts) > 1 else next(iter(drafts))
    if draft in drafts:
        return {**models, "draft": drafts[draft]}
    if draft is not None and draft not in ("none", "self") and not Path(draft).is_dir():
        raise ConfigError(f"--draft {draft!r}: {folder} has the drafts {sorted(drafts)}; give one of "
                          "them, a draft checkpoint folder, 'self' or 'none'")
    return models


def load_tokenizer(folder: Path):
    """DIR/tokenizer.json (specdrive's word vocabulary, or a Hugging Face tokenizer with
    Alpamayo-R1's tokens: prompt.tokenizer), checked against the fingerprint every checkpoint
    of DIR recorded (meta.json "tokenizer_sha256"): ids only mean words in the order a model
    was trained on."""
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(f"{folder}: no tokenizer.json beside the checkpoints")
    tok = read_tokenizer(folder)
    for cand in [Path(folder), *sorted(p for p in Path(folder).iterdir() if p.is_dir())]:
        if not (cand / "meta.json").is_file():
            continue
        want = read_meta(cand).tokenizer_sha256
        if want is not None and want != tok.fingerprint:
            raise ConfigError(f"{file} (sha256 {tok.fingerprint[:12]}...) is not the tokenizer {cand} was "
                              f"trained with (sha256 {str(want)[:12]}...): its ids would mean other "
                              "words; use the tokenizer.json that came with the checkpoint")
    return tok


@dataclass
class ModelSource:
    """What a planner runs: exactly one of an engines folder, a checkpoint folder or a preset
    of random weights (seeded by random_init), and how (backend, draft, torch device)."""
    engines: Path | None = None
    checkpoint: Path | None = None
    preset: str | None = None
    random_init: int | None = None
    backend: str | None = None
    draft: str | None = None
    device: str = "cpu"
    eager: bool = False
    kv_buckets: bool | None = None   # torch: attention over a kv-length bucket (None: on CUDA)
    threads: int = 0              # engine CPU threads (onnxruntime; torch's are set by the tools)
    expect_fingerprint: str | None = None   # the folder's pinned fingerprint: another is refused

    def __post_init__(self):
        if self.preset is not None and self.random_init is None:
            raise ConfigError("--preset needs --random-init SEED (random weights); "
                              "trained models come with --checkpoint DIR")
        check_fingerprint_text(self.expect_fingerprint)
        if self.expect_fingerprint is not None and self.folder is None:
            raise ConfigError("--expect-fingerprint pins a --checkpoint or --engines folder; --preset models "
                              "have no folder to pin")

    @property
    def folder(self) -> Path | None:
        """The artifact folder it runs (engines or checkpoint), None for a preset."""
        return self.engines if self.engines is not None else self.checkpoint


def source_fingerprint(src: ModelSource, profile_pin: str | None = None) -> str | None:
    """The fingerprint of the folder `src` runs (core/artifacts.py folder_fingerprint; None for
    a preset), checked against --expect-fingerprint and the planner profile's `fingerprint`
    (ConfigError when either differs)."""
    if src.folder is None:
        if profile_pin is not None:
            raise ConfigError("the planner profile pins a fingerprint, but --preset models have no folder; "
                              "give the pinned --checkpoint or --engines folder")
        return None
    return pinned_fingerprint(src.folder, ("--expect-fingerprint", src.expect_fingerprint),
                              ("the planner profile's fingerprint", profile_pin), what="model folder")


def open_backend(src: ModelSource, max_len: int, default_tokenizer=None, k_max: int | None = None):
    """The backend (caches of `max_len` rows) and tokenizer of `src`: (backend, tokenizer)."""
    name, spec = backend_spec(src, max_len, default_tokenizer, k_max)
    return load_backend(name, spec), spec.tokenizer


def backend_spec(src: ModelSource, max_len: int | None, default_tokenizer=None,
                 k_max: int | None = None) -> tuple[str, BackendSpec]:
    """(backend name, BackendSpec) of `src`, its files read and checked; nothing is loaded.

    Random-weight models (a preset) have no tokenizer.json; `default_tokenizer()` gives theirs.
    --backend tensorrt / tensorrt-llm with an engines folder runs the engines its manifest.json
    lists (checked against `max_len` and, when given, the planner's `k_max`).
    """
    if src.random_init is not None and src.preset is None:
        raise ConfigError(f"--random-init {src.random_init} seeds the random weights of --preset models; "
                          "--checkpoint and --engines load trained weights (drop --random-init)")
    if src.expect_fingerprint is not None:        # pinned: nothing is read from another folder
        source_fingerprint(src)
    spec = BackendSpec(tokenizer=None, max_len=max_len, device=src.device, eager=src.eager, k_max=k_max,
                       kv_buckets=src.kv_buckets,
                       threads=src.threads, draft=src.draft, seed=src.random_init)
    name = _engines_spec(src, spec) if src.engines is not None else _models_spec(src, spec, default_tokenizer)
    return name, spec


def _engines_spec(src: ModelSource, spec: BackendSpec) -> str:
    """Fill `spec` from an engines folder (meta.json, manifest.json, tokenizer) -> backend name."""
    meta = read_engines_meta(src.engines)       # checked whole: its facts as exported, graphs, shapes
    name = src.backend or meta.backend
    if name not in ENGINE_BACKENDS:         # graphs run as exported: meta.json names the backend
        if meta.backend not in BACKENDS:
            raise ConfigError(f"{src.engines}/meta.json: kind {meta.kind!r} backend {meta.backend!r}; "
                              f"expected kind 'engines' and a backend of {sorted(BACKENDS)}")
        if name != meta.backend:
            raise ConfigError(f"--backend {name} but {src.engines} holds {meta.backend} engines")
    spec.engines, spec.meta = Path(src.engines), meta
    spec.manifest = read_manifest(src.engines, name) if name in ENGINE_BACKENDS else None
    spec.tokenizer = load_tokenizer(src.engines)
    return name


def _models_spec(src: ModelSource, spec: BackendSpec, default_tokenizer) -> str:
    """Fill `spec` from a checkpoint folder or a preset (the torch reference backend) -> "torch"."""
    name = src.backend or "torch"
    if name != "torch":
        raise ConfigError(f"--backend {name} runs built engines: give --engines DIR "
                          "(--checkpoint and --preset run the torch reference backend)")
    if src.checkpoint is not None:
        spec.tokenizer = load_tokenizer(src.checkpoint)
        if is_release(src.checkpoint):    # no drafts inside: --draft self|none|DIR
            spec.checkpoints = {"alpamayo": Path(src.checkpoint)}
        else:
            spec.checkpoints = find_checkpoints(src.checkpoint, src.draft)
            spec.draft = None if "draft" in spec.checkpoints else src.draft   # a variant found here, or self/none/a path
        return name
    if default_tokenizer is None:
        raise ConfigError("--preset models need a tokenizer; give --checkpoint DIR with tokenizer.json")
    spec.tokenizer, spec.preset = default_tokenizer(), src.preset
    return name
