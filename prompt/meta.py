"""meta.json, the identity card of every artifact (checkpoints, exported graphs, engines), and
the checkpoints of a folder found by theirs. Standard library only: models/, export/, engines/
and runtime/ read artifacts through these two functions.
"""
from __future__ import annotations

from pathlib import Path

from prompt.config import ConfigError, read_json

META = "meta.json"
CHECKPOINT_FORMAT = "specdrive-checkpoint"
MODEL_KINDS = ("target", "draft", "expert", "planner")


def read_meta(folder) -> dict:
    """FOLDER/meta.json as a dict with a "kind"; ConfigError naming the file otherwise."""
    file = Path(folder) / META
    if not file.is_file():
        raise ConfigError(f"{folder}: no {META}; not a specdrive artifact")
    meta = read_json(file, "artifact metadata")
    if not isinstance(meta, dict) or "kind" not in meta:
        raise ConfigError(f"{file}: no 'kind'; cannot tell what this artifact is")
    return meta


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
        meta = read_meta(cand)
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
