"""The CoC language of world v2: paraphrases, optional clauses, the parser that grades it, and
what each part of a CoC depends on."""
from collections import defaultdict

import numpy as np
import pytest

from scenes import language as L
from scenes.config import DECISIONS, DT
from scenes.dataset import scene_seed
from scenes.grade import commitment_correct
from scenes.world import make_scene, pick_family

SLOTS = {"num": "12.3", "noun": "van", "side": "left", "light": "yellow"}


@pytest.fixture(scope="module")
def scenes():
    out = []
    for split, n in (("train", 240), ("heldout", 60), ("unseen", 20)):
        for i in range(n):
            seed = scene_seed(5, split, i)
            out.append(make_scene(seed, pick_family(seed, split), split, render=False))
    return out


def _all_templates():
    for part, table in (("routine", L.ROUTINE), ("cause", L.CAUSE), ("detail", L.DETAIL)):
        for key, options in table.items():
            for t in options:
                yield part, key, t


def test_every_clause_has_at_least_four_paraphrases():
    for table in (L.ROUTINE, L.CAUSE, L.DETAIL, L.ACTION):
        for key, options in table.items():
            assert len(options) >= 4 and len(set(options)) == len(options), key
    assert set(L.ACTION) == set(DECISIONS)


def test_every_paraphrase_parses_back_to_its_own_clause_and_no_other():
    for part, key, t in _all_templates():
        words = L.fill(t, SLOTS)
        matches = {(p, k) for p, k2, tt in _all_templates() for k in [k2] if L._match(tt, words) is not None}
        assert matches == {(part, key)}, f"{t!r} is read as {matches}"
        assert L.classify(words)[:2] == (part, key)
    for decision, options in L.ACTION.items():
        for phrase in options:
            for hedge in ("",) + L.HEDGES:
                assert L.classify(["so", *phrase.split(), *hedge.split()])[:2] == ("action", decision)


def test_paraphrases_of_a_cause_name_the_same_facts():
    for kind, options in L.CAUSE.items():
        slots = [{w for w in t.split() if w.startswith("{") and w != "{num}"} for t in options]
        assert all(s == slots[0] for s in slots), f"{kind}: paraphrases name different facts {slots}"


def test_cocs_parse_whole_and_grade_themselves_right(scenes):
    for s in scenes:
        words = s.coc.split(" ")
        assert len(s.coc_routine) == len(words)
        n = sum(s.coc_routine)
        assert s.coc_routine == [True] * n + [False] * (len(words) - n), "routine words must come first"
        assert all(p is not None for p in L.parse(words)), f"a clause of {s.coc!r} is not in the grammar"
        assert L.routine_length(words) == n
        assert commitment_correct(words, s) == (True, True), s.coc


def test_grading_reads_the_facts_not_the_wording(scenes):
    s = next(x for x in scenes if x.cause_kind == "follow")
    noun = s.cause_facts["noun"]
    other = "car" if noun == "van" else "van"
    routine = s.coc.split(" ")[:sum(s.coc_routine)]
    said = lambda text: routine + text.split()                         # noqa: E731
    assert commitment_correct(said(f"there is a {noun} 3.0 m ahead , so stay behind it"), s) == (True, True)
    assert commitment_correct(said(f"a {other} is 3.0 m ahead , so follow it"), s) == (False, True)
    assert commitment_correct(said(f"a {noun} leads 9.9 m ahead , so speed up"), s)[1] is (s.decision == "speed_up")
    assert commitment_correct(said("a flying pig is ahead , so follow it"), s) == (False, True)


def test_routine_content_is_a_function_of_the_history_and_the_wording_is_drawn(scenes):
    for s in scenes[:80]:
        a = [L.classify(c) for c in L.routine_clauses(s.history, np.random.default_rng(1))]
        b = [L.classify(c) for c in L.routine_clauses(s.history, np.random.default_rng(2))]
        da, db = ({k: v for _, k, v in parsed} for parsed in (a, b))
        assert {k for k in da if k != "distance"} == {k for k in db if k != "distance"}, (a, b)   # distance: optional
        assert all(da[k] == db[k] for k in set(da) & set(db)), (a, b)
    first = {" ".join("#" if L.NUMBER.match(w) else w for w in L.clauses_of(s.coc.split(" "))[0]) for s in scenes}
    assert len(first) >= 4, f"the speed clause always opens the same way: {first}"


def _opening(clause) -> str:
    return " ".join("#" if L.NUMBER.match(w) else w for w in clause)


def test_the_routine_wording_is_habitual_and_the_commitment_wording_is_not(scenes):
    """Routine: one history's clauses over many draws mostly take its speed band's habit, and
    the habit differs between bands. Commitment: the cause paraphrase is drawn uniformly."""
    habits = {}
    for s in scenes[:60]:
        draws = [_opening(L.routine_clauses(s.history, np.random.default_rng(k))[0]) for k in range(200)]
        top = max(set(draws), key=draws.count)
        share = draws.count(top) / len(draws)
        assert 0.8 < share < 0.97, f"the opening clause takes its habit in {share:.0%} of draws"
        habits.setdefault(L.speed_band(L.history_facts(s.history)["max_speed"]), set()).add(top)
    assert len({t for tops in habits.values() for t in tops}) >= 3, habits
    causes = [L.cause_clause("follow", {"noun": "car", "distance": 12.0}, np.random.default_rng(k)) for k in range(400)]
    shares = [sum(c == L.fill(t, {"num": "12.0", "noun": "car"}) for c in causes) / 400 for t in L.CAUSE["follow"]]
    assert max(shares) < 0.4 and min(shares) > 0.1, shares


def test_the_history_does_not_decide_the_commitment(scenes):
    by_motion = defaultdict(set)
    for s in scenes:
        f = L.history_facts(s.history)
        by_motion[(round(f["speed"]), abs(f["accel"]) < 0.4)].add(s.cause_kind)
    assert sum(len(k) >= 3 for k in by_motion.values()) >= 5, "the history alone tells the cause"


def test_commitment_names_the_visible_cause(scenes):
    named = 0
    for s in scenes:
        if s.cause is None:
            continue
        kind = s.agents[s.cause]["kind"]
        if kind in ("car", "van") and "noun" in s.cause_facts:
            assert s.cause_facts["noun"] == kind
        named += 1
    assert named > len(scenes) // 3


def _history(speed0, accel=0.0, yaw_rate=0.0):
    t = np.arange(-15, 1) * DT
    v = speed0 + accel * t
    heading = yaw_rate * t
    step = np.concatenate([[0.0], v[1:] * DT])
    x, y = np.cumsum(step * np.cos(heading)), np.cumsum(step * np.sin(heading))
    return np.stack([x - x[-1], y - y[-1], heading], axis=1)


def test_routine_clauses_follow_speed_trend_and_turning():
    keys = lambda h: [L.classify(c)[1] for c in L.routine_clauses(h, np.random.default_rng(0))]   # noqa: E731
    assert keys(_history(10.0))[0] == "speed" and "steady" in keys(_history(10.0))
    assert "decel" in keys(_history(8.0, accel=-2.0)) and "accel" in keys(_history(8.0, accel=2.0))
    turning = [L.classify(c) for c in L.routine_clauses(_history(6.0, yaw_rate=0.3), np.random.default_rng(0))]
    assert any(k == "turning" and v["side"] == "left" for _, k, v in turning)
    assert keys(_history(0.0))[0] == "stopped"
    speed = L.classify(L.routine_clauses(_history(12.34), np.random.default_rng(0))[0])[2]["num"]
    assert speed == pytest.approx(12.3)


def test_unknown_kind_or_decision_is_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="'parade'.*allowed"):
        L.cause_clause("parade", {}, rng)
    with pytest.raises(ValueError, match="'fly'.*allowed"):
        L.commitment_clauses("stop_sign", {"distance": 3.0}, "fly", {}, rng)
