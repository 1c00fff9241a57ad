"""The facts a module's weights compute under beyond their shapes, kept where a card edit cannot
reach them.

A checkpoint's meta.json holds the config the host builds the rotary tables and the image mask
from (rope_theta, mrope_section, interleaved, head_dim; the target's image_attention). An edit of
those fields in every card of a folder still loads (the shapes are unchanged) and plans wrong, so
`io.save` also writes them into each module's safetensors header (metadata "specdrive.facts"),
which the file's sha256 covers, and `io.load` refuses a card that disagrees with its weights.

Weights saved before the header carried them (checkpoints/tiny's) are looked up by their sha256 in
LEGACY: the facts they were trained under, as shipped. LEGACY holds the rotary facts only: the
tests declare the shipped weights under either image layout (tests/folders.py set_layout: exact
either way, though not the layout the training made). Other weights without the header are not
checked here; pin the folder's fingerprint (--expect-fingerprint) to run only what was checked.
"""
from __future__ import annotations

import json

from core.config import ConfigError

FACTS_KEY = "specdrive.facts"
_MROPE = {"head_dim": 32, "rope_theta": 5000000.0, "mrope_section": [6, 5, 5], "interleaved": True}
_FLAT = {**_MROPE, "mrope_section": []}
LEGACY = {   # sha256 of a shipped module file (checkpoints/tiny) -> its rotary facts
    "7b7c12f2556c78d92ffaba6511f11f234ed671b791f37e18aab6c22c901f40c1": _MROPE,     # target
    "6f9964d040ffb83b0b627d5eba3882ae30e268412d7b41c32ed542bb38bddcc3": _MROPE,     # expert
    "a27f891166a1f44bb0a6d248d338d9b6864bb7227fd5a1e2191d4bb4bc5b2628": _MROPE,     # draft-mrope
    "b8db37d658a60de2c2a49aeb25d0a99b6234c5371cb53a3288c43d210d089059": _FLAT,      # draft-flat
    "b6c9ed2a3313b6cce2c4e1f08aa817d25b1bbf48f29fc1bade35c682289cb0f4": _FLAT,      # draft-flat-aarl
    "b32a1ddb9fc96a883db0ece9a2a99466962c3e9cbdb0cf88efe101129d75f34e": _FLAT,      # draft-flat-standalone
    "a0bcaad32e22b7ba8d00b5d9efbe9149cf018bef4e73fa5b23c723f9e5736b87": _FLAT,      # draft-flat-v256
    "f37527cd866966a85f66e510fafef7a71bbb9b6c1880b3c6d5b9f6d1115febb2": _FLAT,      # draft-eagle3-v256
}


def module_facts(config, module: str) -> dict | None:
    """The facts module `module` of a ModelConfig computes under: the rotary facts of the LLM it
    runs (a draft: its own decoder; the target and the expert, which reads the target's cache: the
    target's) and, for the target, the image layout. None for other configs."""
    if not hasattr(config, "draft_llm"):
        return None
    llm = config.draft_llm() if module == "draft" else config.target.llm
    out = {"head_dim": llm.head_dim, "rope_theta": float(llm.rope_theta),
           "mrope_section": list(llm.mrope_section), "interleaved": bool(llm.interleaved)}
    if module == "target":
        out["image_attention"] = llm.image_attention
    return out


def header_metadata(config, module: str) -> dict[str, str] | None:
    """The safetensors metadata io.save writes for `module` ({FACTS_KEY: JSON}), or None."""
    facts = module_facts(config, module)
    return None if facts is None else {FACTS_KEY: json.dumps(facts, sort_keys=True)}


def check_weight_facts(file, header: dict, sha256: str, config, module: str) -> None:
    """ConfigError naming the field when meta.json's config differs from the facts the weights in
    `file` carry (their header) or were shipped with (LEGACY, by sha256)."""
    have = module_facts(config, module)
    raw = (header.get("__metadata__") or {}).get(FACTS_KEY)
    if have is None or (raw is None and sha256 not in LEGACY):
        return
    try:
        said = json.loads(raw) if raw is not None else LEGACY[sha256]
    except ValueError:
        raise ConfigError(f"{file}: its {FACTS_KEY!r} metadata is not JSON; the file was damaged") from None
    for key, want in (said.items() if isinstance(said, dict) else ()):
        if key in have and have[key] != want:
            raise ConfigError(f"{file.parent}/meta.json: config field {key!r} of module {module!r} is {have[key]!r}, "
                              f"but its weights ({file.name}) were made for {want!r}: the card was edited and would "
                              "plan with other arithmetic; restore the value the weights carry (or re-save them)")
