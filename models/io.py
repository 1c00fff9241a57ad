"""specdrive's own checkpoint format: a folder of safetensors files plus `meta.json`.

    ckpt/
      meta.json            what this is (kind), the config, dtype, every tensor's shape and dtype,
                           sha256 of every file, library versions, the command that made it
      <module>.safetensors one file per module ("target", "draft", "expert", or "model"); its header
                           carries the rope/layout facts the weights compute under (models/weight_facts.py)

What an artifact is comes from its meta.json, never from its path or file names. A checkpoint that
does not match its meta.json or the module it is loaded into (missing tensor, wrong shape, wrong
dtype, truncated file, hash mismatch, unknown kind) is refused with a CheckpointError naming the
file, the tensor and what was expected. Tensors are read with safetensors only, never pickle.

A trained planner folder (tokenizer.json + target, expert and draft checkpoints, found by their
meta.json kind) loads through one path, used by train/, tools/ and the torch backend:

    tok, cfg, target, expert = load_planner(folder)      drafts: scan_checkpoints(folder)[1] -> load_draft
    cfg, target, expert, draft = load_models({kind: folder}, tok)
    cfg, draft, meta = load_draft(folder, cfg, target)
    check_names(expected_shapes, tensors, what)          one name/shape check for foreign layouts
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import struct
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Mapping

import numpy as np
import safetensors.torch
import torch

import models.config as config_module  # config classes live there and only there
from models.action_expert import ActionExpert
from models.draft import Draft
from models.names import CheckpointError, check_names  # noqa: F401  (re-exported: io.CheckpointError)
from models.target import Target
from models.weight_facts import check_weight_facts, header_metadata
from core.config import ConfigError, file_sha256, from_dict, to_dict
from prompt.draft_vocab import check_d2t, d2t_sha256
# read_meta and scan_checkpoints are core.artifacts' (io.scan_checkpoints reads a planner folder)
from core.artifacts import META, MODEL_KINDS, \
    CheckpointMeta, ModuleFile, TensorSpec, read_meta, scan_checkpoints  # noqa: F401
from prompt.tokenizer import load_tokenizer
from prompt.vocab import Tokenizer

_RESERVED = {"format", "format_version", "kind", "config", "config_class", "dtype", "modules",
             "versions", "created_by", "created_at"}


def save(path, modules: Mapping, config, meta: Mapping) -> Path:
    """Write `modules` ({name: nn.Module or state dict}) and `config` under folder `path`.

    `meta` must hold `kind` (one of MODEL_KINDS); other keys (e.g. "source_checkpoint") are kept as is.
    Returns the folder. Existing files of the same names are overwritten.
    """
    meta = dict(meta)
    kind = meta.pop("kind", None)
    _check_kind(kind, "meta argument")
    clash = sorted(set(meta) & _RESERVED)
    if clash:
        raise CheckpointError(f"meta keys {clash} are written by save(); leave them out")
    if not dataclasses.is_dataclass(config):
        raise CheckpointError(f"config must be a config dataclass, got {type(config).__name__}")
    if not modules:
        raise CheckpointError("nothing to save: `modules` is empty")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    entries, dtypes = {}, set()
    for name, module in modules.items():
        state = _state_dict(module)
        dtypes |= {_dtype_name(t.dtype) for t in state.values()}
        entries[name] = _write_module(path, name, state, config)
    made = {"versions": _versions(), "created_by": " ".join(sys.argv),
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"
    CheckpointMeta.new(path, kind, type(config).__name__, to_dict(config), dtype, entries, {**made, **meta}).write(path)
    return path


def load(path, kind: str | None = None):
    """Read folder `path` -> (state dicts {module: {tensor: Tensor}}, config dataclass,
    CheckpointMeta).

    Every file is checked against meta.json (size, sha256, tensor names, shapes, dtypes) before
    use. `kind`, when given, must equal the checkpoint's kind.
    """
    path = Path(path)
    try:
        meta = read_meta(path)
    except CheckpointError:
        raise
    except ConfigError as e:            # no meta.json, not JSON, no kind, not a checkpoint
        raise CheckpointError(str(e)) from None
    if not isinstance(meta, CheckpointMeta):
        raise CheckpointError(f"{path / META}: unknown kind {meta.kind!r}; allowed kinds are {list(MODEL_KINDS)}")
    if kind is not None and meta.kind != kind:
        raise CheckpointError(f"{path / META}: kind is {meta.kind!r}, expected {kind!r}")
    config = _build_config(path, meta)
    states = {name: _read_module(path, name, entry, config) for name, entry in meta.modules.items()}
    return states, config, meta


def load_into(path, modules: Mapping[str, torch.nn.Module], kind: str | None = None):
    """Load a checkpoint into already-built modules (strict: names, shapes and dtypes must match).

    Returns (config, meta). Nothing is cast: a float16 checkpoint is refused by a float32 module.
    """
    states, config, meta = load(path, kind)
    missing = sorted(set(modules) - set(states))
    if missing:
        raise CheckpointError(f"{path}: no module(s) {missing}; the checkpoint has {sorted(states)}")
    for name, module in modules.items():
        check_state(module.state_dict(), states[name], f"{path}/{name}.safetensors")
        module.load_state_dict(states[name], strict=True)
    return config, meta


def check_state(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], where: str):
    """Refuse `found` unless it has exactly the tensors of `expected` with equal shapes and dtypes."""
    for key, ref in expected.items():
        want = f"expected shape {tuple(ref.shape)} {_dtype_name(ref.dtype)}"
        if key not in found:
            raise CheckpointError(f"{where}: missing tensor {key!r} ({want})")
        got = found[key]
        if tuple(got.shape) != tuple(ref.shape) or got.dtype != ref.dtype:
            raise CheckpointError(
                f"{where}: tensor {key!r} has shape {tuple(got.shape)} {_dtype_name(got.dtype)}, {want}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(f"{where}: unexpected tensor(s) {extra[:5]} (the module has no such names)")


def _check_kind(kind, where: str) -> None:
    if kind not in MODEL_KINDS:
        raise CheckpointError(f"{where}: unknown kind {kind!r}; allowed kinds are {list(MODEL_KINDS)}")


def _state_dict(module) -> dict[str, torch.Tensor]:
    state = module.state_dict() if isinstance(module, torch.nn.Module) else dict(module)
    out, seen = {}, set()
    for key, t in state.items():
        t = t.detach().cpu().contiguous()
        # safetensors refuses tensors sharing storage (tied weights): give each its own copy
        ptr = t.untyped_storage().data_ptr()
        out[key] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _write_module(path: Path, name: str, state: dict, config) -> ModuleFile:
    if not name.isidentifier():
        raise CheckpointError(f"module name {name!r} must be a Python identifier (it names a file)")
    file = path / f"{name}.safetensors"
    safetensors.torch.save_file(state, str(file), metadata=header_metadata(config, name))
    tensors = {k: TensorSpec(k, tuple(t.shape), _dtype_name(t.dtype)) for k, t in state.items()}
    return ModuleFile(file.name, file_sha256(file), file.stat().st_size, tensors)


def _read_module(path: Path, name: str, entry: ModuleFile, config) -> dict[str, torch.Tensor]:
    file = path / entry.file
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (meta.json lists it for module {name!r})")
    header = _check_complete(file, entry)
    digest = file_sha256(file)
    if digest != entry.sha256:
        raise CheckpointError(f"{file}: sha256 {digest[:16]}... does not match meta.json "
                              f"({entry.sha256[:16]}...); the file was changed or corrupted")
    check_weight_facts(file, header, digest, config, name)     # the card's rope/layout against the weights'
    state = safetensors.torch.load_file(str(file))
    listed = {k: torch.empty(v.shape, dtype=_dtype(v.dtype), device="meta") for k, v in entry.tensors.items()}
    check_state(listed, state, str(file))
    return state


def _check_complete(file: Path, entry: ModuleFile) -> dict:
    """A safetensors file is 8 bytes of header length, the JSON header, then the data; a file
    shorter than header + largest data offset is truncated (checked before hashing, for a clear
    message). -> the header."""
    size = file.stat().st_size
    expected = entry.bytes
    if expected is not None and size < expected:
        raise CheckpointError(f"{file}: truncated, {size} bytes but meta.json says {expected}")
    if size < 8:
        raise CheckpointError(f"{file}: truncated, {size} bytes (no safetensors header)")
    with file.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(min(n, size))
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{file}: truncated or corrupt safetensors header") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size < 8 + n + end:
        raise CheckpointError(f"{file}: truncated, {size} bytes but its header needs {8 + n + end}")
    return header


def _build_config(path: Path, meta: CheckpointMeta):
    cls = getattr(config_module, meta.config_class, None)
    if cls is None or not dataclasses.is_dataclass(cls):
        raise CheckpointError(f"{path / META}: unknown config_class {meta.config_class!r}; "
                              f"expected a dataclass of models.config")
    return from_dict(cls, meta.config, where=f"{path / META}: config")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in meta.json")
    return dtype


def _versions() -> dict:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("safetensors", "specdrive"):
        try:
            versions[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def with_tokenizer(cfg: config_module.ModelConfig, tok) -> config_module.ModelConfig:
    """The config with its vocabulary-dependent fields set from `tok` (vocab size, image ids)."""
    llm = dataclasses.replace(cfg.target.llm, vocab_size=len(tok))
    target = dataclasses.replace(cfg.target, llm=llm, image_token_id=tok.image_pad,
                                 vision_start_id=tok.vision_start)
    return dataclasses.replace(cfg, target=target)


def check_tokenizer(cfg: config_module.ModelConfig, tok, where: str, meta: CheckpointMeta | None = None) -> None:
    """The tokenizer must be the checkpoint's: same vocabulary-dependent config fields and,
    when meta.json recorded one, the same fingerprint (ids mean words in one order only)."""
    want_sha = meta.tokenizer_sha256 if meta is not None else None
    if want_sha is not None and want_sha != tok.fingerprint:
        raise ConfigError(f"{where}: the tokenizer (sha256 {tok.fingerprint[:12]}...) is not the one this "
                          f"checkpoint was trained with (sha256 {str(want_sha)[:12]}...)")
    t = cfg.target
    want = (len(tok), tok.image_pad, tok.vision_start)
    got = (t.llm.vocab_size, t.image_token_id, t.vision_start_id)
    if got != want:
        raise ConfigError(f"{where}: (vocab_size, image_token_id, vision_start_id) = {got} but the "
                          f"tokenizer has {want}; the checkpoint belongs to another vocabulary")


def new_models(cfg: config_module.ModelConfig, seed: int) -> tuple[Target, ActionExpert, Draft]:
    """Random-weight target, expert and draft of `cfg`, seeded."""
    torch.manual_seed(seed)
    target, expert = Target(cfg.target), ActionExpert(cfg.expert, cfg.target.llm)
    return target, expert, Draft(cfg, target.embed_tokens, target.lm_head)


def load_models(ckpts: Mapping[str, Path], tok):
    """{kind: folder} (target + expert [+ draft], planner, or "alpamayo": a release folder) ->
    (cfg, target, expert, draft or None), every file checked against its meta.json (or the
    release's config.json) and the tokenizer; eval mode."""
    if "alpamayo" in ckpts:
        from models.alpamayo import load_alpamayo   # it imports this module
        target, expert, cfg = load_alpamayo(ckpts["alpamayo"])
        check_tokenizer(cfg, tok, str(ckpts["alpamayo"]))
        return cfg, target.eval(), expert.eval(), None
    main = Path(ckpts.get("planner") or ckpts["target"])
    _, cfg, meta = load(main, kind="planner" if "planner" in ckpts else "target")
    check_tokenizer(cfg, tok, str(main), meta)
    target, expert = Target(cfg.target), ActionExpert(cfg.expert, cfg.target.llm)
    draft = None
    if "planner" in ckpts:
        if cfg.draft.vocab:
            raise ConfigError(f"{main}: a planner checkpoint with a reduced draft head is not supported; "
                              "keep the draft in its own folder (kind 'draft')")
        draft = Draft(cfg, target.embed_tokens, target.lm_head)
        load_into(main, {"target": target, "draft": draft, "expert": expert}, kind="planner")
        return cfg, target.eval(), expert.eval(), draft.eval()
    load_into(main, {"target": target}, kind="target")
    if "expert" not in ckpts:
        raise ConfigError(f"{main.parent}: no action expert checkpoint (meta.json kind 'expert')")
    load_into(ckpts["expert"], {"expert": expert}, kind="expert")
    if "draft" in ckpts:
        cfg, draft, _ = load_draft(ckpts["draft"], cfg, target, tok, meta.modules["target"].sha256)
    return cfg, target.eval(), expert.eval(), draft


def target_sha256(ckpts: Mapping[str, Path]) -> str | None:
    """The sha256 of the target weights of {kind: folder} (what a draft trained for them records
    as target_sha256); None for a release folder ("alpamayo"), whose weights no draft records."""
    main = ckpts.get("planner") or ckpts.get("target")
    return None if main is None else read_meta(main).modules["target"].sha256


def check_trained_for(folder, meta: CheckpointMeta, target_sha: str | None) -> None:
    """A draft whose meta.json records target_sha256 of other target weights than `target_sha` is
    refused, naming both (a draft predicts the weights it was trained against, not these)."""
    recorded = meta.extra.get("target_sha256")
    if target_sha is not None and recorded is not None and recorded != target_sha:
        raise ConfigError(f"{folder}: this draft was trained for the target weights sha256 {recorded}, but the "
                          f"target here has sha256 {target_sha}; allowed: a draft whose meta.json target_sha256 "
                          "is the target's (train it again for these weights, or use the draft that came with them)")


def load_draft(folder, cfg: config_module.ModelConfig, target: Target, tok=None, target_sha: str | None = None):
    """A draft checkpoint for `target` (sharing its embedding and LM head) -> (cfg with the
    draft's DraftConfig, draft (eval mode), meta). `target_sha` (the target weights' sha256,
    target_sha256()) must be what the draft's meta.json records, when it records one. A
    reduced-head draft's d2t map is checked against meta.json (draft_vocab, d2t_sha256) and,
    when `tok` is given, the tokenizer."""
    _, dcfg, meta = load(folder, kind="draft")
    check_trained_for(folder, meta, target_sha)
    if dcfg.target != cfg.target:
        raise ConfigError(f"{folder}: this draft was trained for a different target (its "
                          "meta.json target config differs from the target checkpoint's)")
    cfg = dataclasses.replace(cfg, draft=dcfg.draft)
    draft = Draft(cfg, target.embed_tokens, target.lm_head)
    load_into(folder, {"draft": draft}, kind="draft")
    if dcfg.draft.vocab:
        check_draft_vocab(draft, meta, tok, f"{folder}/draft.safetensors")
    return cfg, draft.eval(), meta


def check_draft_vocab(draft: Draft, meta: CheckpointMeta, tok, where: str) -> None:
    """A reduced head's d2t must be what meta.json recorded and fit the tokenizer (ids in range,
    no duplicates, the special tokens kept, no trajectory token): else ConfigError."""
    n, sha = draft.cfg.vocab, meta.d2t_sha256
    if meta.draft_vocab != n or not isinstance(sha, str):
        raise ConfigError(f"{where}: a {n}-row draft head needs meta.json draft_vocab {n} and d2t_sha256; "
                          f"found draft_vocab {meta.draft_vocab!r}, d2t_sha256 {sha!r}")
    d2t = draft.d2t.cpu().numpy()
    if tok is not None:
        check_d2t(d2t, tok, where, sha)
    elif d2t_sha256(d2t) != sha or d2t.min() < 0 or d2t.max() >= draft.llm.vocab_size \
            or np.unique(d2t).size != d2t.size:
        raise ConfigError(f"{where}: d2t does not match meta.json's d2t_sha256 or is not a map into "
                          f"[0, {draft.llm.vocab_size}) without repeats")


def load_planner(folder) -> tuple[Tokenizer, config_module.ModelConfig, Target, ActionExpert]:
    """Tokenizer, config, target and expert of a trained planner folder (eval mode); its drafts
    are `scan_checkpoints(folder)[1]`, loaded with `load_draft`."""
    folder = Path(folder)
    tok = load_tokenizer(folder)
    cfg, target, expert, _ = load_models(scan_checkpoints(folder)[0], tok)
    return tok, cfg, target, expert
