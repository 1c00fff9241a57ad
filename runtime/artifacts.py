"""What the planner is given: checkpoints and engine folders, identified by their meta.json.

A checkpoint folder (`--checkpoint DIR`) holds the tokenizer (tokenizer.json) and one or more
specdrive checkpoints, each a folder with a meta.json whose `kind` says what it is (target,
draft, expert, or planner = all in one); DIR itself may be one. Folder names are never read
for meaning. An engines folder (`--engines DIR`) has a meta.json with kind "engines" and the
backend that runs it. Anything else is refused with a ConfigError saying what was found.
"""
from __future__ import annotations

import json
from pathlib import Path

from prompt.config import ConfigError, read_json
from prompt.vocab import Tokenizer
from runtime.backend import BACKENDS, load_backend

CHECKPOINT_FORMAT = "specdrive-checkpoint"
MODEL_KINDS = ("target", "draft", "expert", "planner")


def read_meta(folder: Path) -> dict:
    file = Path(folder) / "meta.json"
    if not file.is_file():
        raise ConfigError(f"{folder}: no meta.json; not a specdrive artifact")
    meta = read_json(file, "artifact metadata")
    if not isinstance(meta, dict) or "kind" not in meta:
        raise ConfigError(f"{file}: no 'kind'; cannot tell what this artifact is")
    return meta


def find_checkpoints(folder: Path) -> dict[str, Path]:
    """{kind: checkpoint folder} for DIR and its direct subfolders that carry a meta.json."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"checkpoint folder {str(folder)!r} does not exist")
    found: dict[str, Path] = {}
    for cand in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        if not (cand / "meta.json").is_file():
            continue
        meta = read_meta(cand)
        if meta.get("format") != CHECKPOINT_FORMAT or meta["kind"] not in MODEL_KINDS:
            raise ConfigError(f"{cand}/meta.json: format {meta.get('format')!r} kind {meta['kind']!r} "
                              f"is not a specdrive model checkpoint (kinds {list(MODEL_KINDS)})")
        if meta["kind"] in found:
            raise ConfigError(f"{folder}: two checkpoints of kind {meta['kind']!r} "
                              f"({found[meta['kind']]} and {cand}); keep one")
        found[meta["kind"]] = cand
    if "planner" not in found and "target" not in found:
        raise ConfigError(f"{folder}: no target checkpoint (meta.json kind 'target' or 'planner'); "
                          f"found kinds {sorted(found)}")
    return found


def load_tokenizer(folder: Path) -> Tokenizer:
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(f"{folder}: no tokenizer.json beside the checkpoints")
    return Tokenizer.load(file)


def open_backend(args, cfg, default_tokenizer=None):
    """The backend and tokenizer the command line asks for: (backend, tokenizer).

    Random-weight models (--preset) have no tokenizer.json; `default_tokenizer()` gives theirs.
    """
    max_len = 1024
    if args.engines is not None:
        meta = read_meta(args.engines)
        name = meta.get("backend")
        if meta["kind"] != "engines" or name not in BACKENDS:
            raise ConfigError(f"{args.engines}/meta.json: kind {meta['kind']!r} backend {name!r}; "
                              f"expected kind 'engines' and a backend of {sorted(BACKENDS)}")
        if args.backend and args.backend != name:
            raise ConfigError(f"--backend {args.backend} but {args.engines} holds {name} engines")
        tok = load_tokenizer(args.engines)
        return load_backend(name, engines=args.engines, meta=meta, tokenizer=tok), tok
    name = args.backend or "torch"
    if name not in ("torch", "table"):
        raise ConfigError(f"--backend {name} runs built engines: give --engines DIR "
                          "(--checkpoint and --preset run the torch reference backend)")
    if args.checkpoint is not None:
        tok = load_tokenizer(args.checkpoint)
        ckpts = find_checkpoints(args.checkpoint)
        return load_backend(name, checkpoints=ckpts, tokenizer=tok, draft=args.draft,
                            device=args.device, eager=args.eager, max_len=max_len), tok
    if default_tokenizer is None:
        raise ConfigError("--preset models need a tokenizer; give --checkpoint DIR with tokenizer.json")
    tok = default_tokenizer()
    if name == "table":
        return load_backend("table", vocab_size=len(tok), max_len=max_len, seed=args.random_init,
                            draft_noise=0.5, stop_id=tok.cot_end, stop_slope=0.3), tok
    return load_backend(name, preset=args.preset, seed=args.random_init, tokenizer=tok,
                        draft=args.draft, device=args.device, eager=args.eager, max_len=max_len), tok
