"""Chain-of-causation text: length, routine/commitment flags, vocabulary, what each part depends on."""
from collections import defaultdict

import numpy as np
import pytest

from scenes.coc import commitment_words, routine_words, vocabulary
from scenes.config import DECISIONS, DT
from scenes.dataset import scene_seed
from scenes.world import make_scene, pick_family

# the word of each cause kind that its commitment must contain
CAUSE_WORD = {"car": "car", "van": "van", "pedestrian": "pedestrian", "cyclist": "cyclist", "cone": "cones",
              "traffic_light": "light", "stop_sign": "stop", "door": "door"}


@pytest.fixture(scope="module")
def scenes():
    out = []
    for split, n in (("train", 700), ("heldout", 150), ("unseen", 60)):
        for i in range(n):
            seed = scene_seed(5, split, i)
            out.append(make_scene(seed, pick_family(seed, split), split, render=False))
    return out


def test_coc_is_15_to_40_plain_words_with_one_flag_each(scenes):
    for s in scenes:
        words = s.coc.split(" ")
        assert 15 <= len(words) <= 40, f"{len(words)} words: {s.coc}"
        assert all(w and (w == "," or "," not in w) for w in words), f"bad spacing or punctuation: {s.coc!r}"
        assert len(s.coc_routine) == len(words)
        n = sum(s.coc_routine)
        assert s.coc_routine == [True] * n + [False] * (len(words) - n), "routine words must come first"
        assert 0 < n < len(words)


def test_routine_words_are_a_function_of_the_history(scenes):
    for s in scenes:
        n = sum(s.coc_routine)
        assert s.coc.split(" ")[:n] == routine_words(s.history, s.routine_variant), s.coc


def test_the_history_does_not_decide_the_commitment(scenes):
    by_routine = defaultdict(set)
    for s in scenes:
        n = sum(s.coc_routine)
        by_routine[" ".join(s.coc.split(" ")[:n])].add(s.family)
    shared = [r for r, fams in by_routine.items() if len(fams) >= 2]
    assert len(shared) >= 20, f"only {len(shared)} routine texts occur in more than one family"


def test_commitment_names_the_cause_and_a_closed_decision(scenes):
    for s in scenes:
        assert s.decision in DECISIONS
        commit = s.coc.split(" ")[sum(s.coc_routine):]
        if s.cause is not None:
            word = CAUSE_WORD[s.agents[s.cause]["kind"]]
            assert word in commit, f"cause {s.agents[s.cause]['kind']} not named in {' '.join(commit)!r}"


def test_vocabulary_covers_every_word(scenes):
    vocab = vocabulary()
    assert vocab == sorted(set(vocab)) and all(w and " " not in w for w in vocab)
    missing = {w for s in scenes for w in s.coc.split(" ")} - set(vocab)
    assert not missing, f"words missing from vocabulary(): {sorted(missing)}"


def test_routine_share_is_near_the_papers(scenes):
    routine = sum(sum(s.coc_routine) for s in scenes)
    total = sum(len(s.coc_routine) for s in scenes)
    assert 0.70 <= routine / total <= 0.80, f"routine share {routine / total:.3f}"


def _history(speed0, accel=0.0, yaw_rate=0.0):
    """(16, 3) ego-frame history ending at the origin, integrated backwards from t0."""
    t = np.arange(-15, 1) * DT
    v = speed0 + accel * t
    heading = yaw_rate * t
    step = np.concatenate([[0.0], v[1:] * DT])
    x = np.cumsum(step * np.cos(heading))
    y = np.cumsum(step * np.sin(heading))
    return np.stack([x - x[-1], y - y[-1], heading], axis=1)


def test_routine_words_follow_speed_trend_and_turning():
    steady = routine_words(_history(10.0), 0)
    assert steady[:7] == ["ego", "is", "driving", "at", "10", "m/s", ","] and "steady" in steady
    assert "slowing" in routine_words(_history(8.0, accel=-2.0), 0)
    assert "speeding" in routine_words(_history(8.0, accel=2.0), 1)
    turning = routine_words(_history(6.0, yaw_rate=0.3), 0)
    assert turning[turning.index("turning") + 1] == "left"
    assert routine_words(_history(0.0), 1)[2] == "stopped"
    assert routine_words(_history(10.0), 0) != routine_words(_history(10.0), 1), "variant has no effect"


def test_commitment_refuses_unknown_family_or_decision():
    with pytest.raises(ValueError, match="'parade'.*allowed"):
        commitment_words("parade", {}, "stop", 0)
    with pytest.raises(ValueError, match="'fly'.*allowed"):
        commitment_words("stop_sign", {}, "fly", 0)
