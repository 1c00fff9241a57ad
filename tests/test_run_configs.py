"""One way to configure a run (issue 34): runtime.config.with_overrides is the one way a command
changes a PlannerConfig, and the typed configs the tools build check their values once."""
import dataclasses

import pytest

from core.config import ConfigError
from runtime.artifacts import ModelSource
from runtime.config import PlannerConfig, load_planner_config, with_overrides


def test_overrides_merge_nested_sections_and_keep_the_rest():
    base = load_planner_config("cpu")
    cfg = with_overrides(base, {"spec": {"k": 8, "adaptive": False}, "budget": {"budget_ms": 0.0},
                                "max_reasoning_tokens": 64})
    assert (cfg.spec.k, cfg.spec.adaptive, cfg.budget.budget_ms, cfg.max_reasoning_tokens) == (8, False, 0.0, 64)
    assert cfg.spec == dataclasses.replace(base.spec, k=8, adaptive=False)     # the rest of spec kept
    assert cfg.budget == dataclasses.replace(base.budget, budget_ms=0.0)
    assert (cfg.checks, cfg.reuse, cfg.cameras) == (base.checks, base.reuse, base.cameras)
    assert with_overrides(base, {}) == base and base == load_planner_config("cpu")     # base untouched


@pytest.mark.parametrize("changes, named", [
    ({"spec": {"kk": 8}}, "kk"),
    ({"budgett": {"budget_ms": 1.0}}, "budgett"),
    ({"reuse": {"vision": True, "lookahead": 2}}, "lookahead"),
])
def test_an_unknown_key_is_named(changes, named):
    with pytest.raises(ConfigError, match=named) as e:
        with_overrides(PlannerConfig(), changes, "mode test")
    assert "mode test" in str(e.value) and "allowed keys" in str(e.value)


@pytest.mark.parametrize("changes, says", [
    ({"spec": {"k": 99}}, "spec.k=99"),
    ({"max_reasoning_tokens": 0}, "max_reasoning_tokens=0"),
    ({"spec": {"adaptive": "no"}}, "adaptive"),
    ({"budget": {"budget_ms": -1.0}}, "budget_ms"),
])
def test_overrides_are_validated_by_the_dataclasses(changes, says):
    with pytest.raises(ConfigError, match=says):
        with_overrides(PlannerConfig(), changes)


def test_a_preset_needs_its_random_init_seed():
    with pytest.raises(ConfigError, match="--random-init"):
        ModelSource(preset="tiny")
    assert ModelSource(preset="tiny", random_init=0).random_init == 0
