"""A measured mode's planner: the profile with the mode's overrides, the one way every room makes it.

A mode is a name and a nested dict of PlannerConfig changes (`specdrive bench`'s k / adaptive /
tree rows, `bench --drives`' reuse rows, `drive`'s table of modes); `mode_config` merges the
changes through runtime.config.with_overrides, so they are re-validated and an unknown key is
refused naming the mode. `greedy_spec` is the decoding part the speed benches share.
"""
from __future__ import annotations

from runtime.config import PlannerConfig, SpecConfig, with_overrides


def mode_config(base: PlannerConfig, name: str, changes: dict,
                max_reasoning_tokens: int | None = None) -> PlannerConfig:
    """`base` with mode `name`'s changes (and the reasoning cap, when given) merged in."""
    if max_reasoning_tokens is not None:
        changes = {**changes, "max_reasoning_tokens": max_reasoning_tokens}
    return with_overrides(base, changes, f"mode {name}")


def greedy_spec(spec: SpecConfig, k: int, adaptive: bool, tree: str = "") -> dict:
    """The spec changes of a speed mode: greedy decoding, so every mode decodes the same tokens;
    draft length `k` (0 = plain decoding) with k_max raised to it, or adaptive k starting from the
    profile's k (4 if the profile says plain) within the profile's k_max; `tree` "N,d,K" or "" (chains)."""
    if adaptive:
        k, k_max = (spec.k or min(4, spec.k_max)), spec.k_max
    else:
        k_max = max(spec.k_max, k)
    return {"decoding": "greedy", "relax_r": 0, "k": k, "k_max": k_max, "adaptive": adaptive, "tree": tree}
