"""The backends a bench compares: the plain target and one backend per draft, all from one
source (runtime.artifacts.backend_spec), so the modes differ only in their draft.

    checkpoint   plain = the target without a draft; every draft variant found (meta.json
                 kind "draft"), or those --drafts names; self / noised:SIGMA add the trained
                 target drafting for itself (a reference point: c = 1, tau = k + 1 when exact)
    engines      one backend: plain is k = 0 on it, the draft is the folder's own
    preset       random weights: plain, and self / noised:SIGMA / routine drafts
"""
from __future__ import annotations

import dataclasses

from core.config import ConfigError
from core.artifacts import scan_checkpoints
from runtime.artifacts import ModelSource, backend_spec
from runtime.backend import BackendSpec, load_backend

SELF_DRAFTS = ("self",)
PRESET_DRAFTS = "self,noised:0.02"


def open_bench_backends(src: ModelSource, drafts: str | None, max_len: int, default_tokenizer=None):
    """(tokenizer, plain backend, {draft label: backend}, description of the source)."""
    name, spec = backend_spec(dataclasses.replace(src, draft="none" if src.engines is None else src.draft),
                              max_len, default_tokenizer)
    if src.engines is not None:
        be = load_backend(name, spec)
        return spec.tokenizer, be, {spec.meta.draft: be}, f"engines {src.engines}"
    if src.checkpoint is not None:
        return spec.tokenizer, load_backend(name, spec), _checkpoint_drafts(src, drafts, spec), \
            f"checkpoint {src.checkpoint}"
    wanted = (drafts or PRESET_DRAFTS).split(",")
    return spec.tokenizer, load_backend(name, spec), self_drafts(wanted, spec), \
        f"preset {src.preset} (random weights)"


def _checkpoint_drafts(src: ModelSource, drafts: str | None, spec: BackendSpec) -> dict:
    """{label: backend} of every draft found (or those `drafts` names, + self / noised:SIGMA)."""
    ckpts, found = scan_checkpoints(src.checkpoint)
    names = None if drafts is None else [d.strip() for d in drafts.split(",") if d.strip()]
    extra = [d for d in names or [] if d in SELF_DRAFTS or d.startswith("noised:")]
    trained = sorted(found)
    if names is not None:
        trained = selected(trained, [d for d in names if d not in extra], "draft variants found")
    base = dataclasses.replace(spec, checkpoints=ckpts)
    out = {label: load_backend("torch", dataclasses.replace(base, draft=str(found[label]))) for label in trained}
    if "planner" in ckpts and drafts is None:
        out.setdefault("planner", load_backend("torch", dataclasses.replace(base, draft=None)))
    out.update(self_drafts(extra, base))
    if not out:
        raise ConfigError(f"{src.checkpoint}: no draft checkpoint (meta.json kind 'draft') to bench; "
                          "--drafts self,noised:SIGMA benches the target drafting for itself")
    return out


def selected(names: list[str], wanted: list[str], what: str) -> list[str]:
    bad = [w for w in wanted if w not in names]
    if bad:
        raise ConfigError(f"--drafts {bad[0]!r} is not available; {what}: {names}")
    return wanted


def preset_drafts(text: str) -> list[str]:
    """The checked draft names of a comma list: self, noised:SIGMA (SIGMA > 0), routine."""
    out = []
    for d in (x.strip() for x in text.split(",") if x.strip()):
        ok = d in ("self", "routine")
        if d.startswith("noised:"):
            try:
                ok = float(d.split(":")[1]) > 0
            except ValueError:
                ok = False
        if not ok:
            raise ConfigError(f"--drafts {d!r} is not allowed; use self, noised:SIGMA (SIGMA > 0), "
                              "routine (--preset) or a draft variant of the checkpoint")
        out.append(d)
    return out


def self_drafts(names, spec: BackendSpec) -> dict:
    """{name: backend} of the target drafting for itself, exactly (self) or noised (noised:SIGMA),
    or (routine) the draft that comes with the models."""
    out = {}
    for d in preset_drafts(",".join(names)) if names else []:
        if d == "routine":
            out[d] = load_backend("torch", dataclasses.replace(spec, draft=None))
        else:
            noise = float(d.split(":")[1]) if d.startswith("noised:") else 0.0
            out[d] = load_backend("torch", dataclasses.replace(spec, draft="self", draft_noise=noise))
    return out
