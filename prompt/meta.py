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
    import hashlib
    import json

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
