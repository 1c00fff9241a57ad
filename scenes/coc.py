"""Chain-of-causation text: a routine part read off the ego history, a commitment read off the cameras.

    routine    = f(history, variant)          speed, speed trend, turning, distance covered (1.5 s)
    commitment = g(family, cause facts, decision, variant)   "the car ahead is braking , so slow down"

Words are separated by single spaces and "," is a word of its own (the tokenizer is word level).
`variant` (0 or 1) is the grammar's seeded variation; the same history and variant always give
the same routine words, so a model can predict them from the history tokens alone.
"""
from __future__ import annotations

import numpy as np

from scenes.config import DT, FAMILIES, DECISIONS

NUMBERS = tuple(str(i) for i in range(100))
WINDOW = (("over", "the", "last", "1.5", "s"), ("in", "the", "past", "1.5", "s"))


def history_facts(history) -> dict:
    """Speed now (m/s), mean accel (m/s^2), yaw rate (deg/s) and distance (m) of a (16, 3) history."""
    h = np.asarray(history, dtype=np.float64)
    speed = np.hypot(np.diff(h[:, 0]), np.diff(h[:, 1])) / DT          # (15,) per step
    accel = (speed[-3:].mean() - speed[:3].mean()) / (12 * DT)        # window centres 1.2 s apart
    heading = np.unwrap(h[:, 2])
    yaw_rate = np.degrees(heading[-1] - heading[-6]) / (5 * DT)
    return {"speed": float(speed[-1]), "max_speed": float(speed.max()), "accel": float(accel),
            "yaw_rate": float(yaw_rate), "distance": float(speed.sum() * DT)}


def routine_words(history, variant: int) -> list[str]:
    """The routine part (ends with ","): a function of the history and the variant only."""
    f = history_facts(history)
    motion = "stopped" if f["speed"] < 0.3 else ("driving", "moving")[variant]
    words = ["ego", "is", motion, "at", _num(f["speed"]), "m/s", ","]
    if f["max_speed"] < 0.3:
        words += ["standing", "still"]
    elif abs(f["accel"]) < 0.4:
        words += ["holding", "a", "steady", "speed"]
    else:
        start = f["speed"] - f["accel"] * 15 * DT            # speed 1.5 s ago at the mean accel
        words += ["speeding", "up"] if f["accel"] > 0 else ["slowing", "down"]
        words += ["from", _num(max(start, 0.0)), "m/s"]
    words += list(WINDOW[variant]) + [","]
    rate = f["yaw_rate"]
    if abs(rate) < 2.0:
        words += ["heading", "straight", ","]
    else:
        words += ["turning", "left" if rate > 0 else "right", "at", _num(abs(rate)), "deg/s", ","]
    return words + ["covering", _num(f["distance"]), "m", ","]


def _num(x: float) -> str:
    return NUMBERS[min(int(round(x)), len(NUMBERS) - 1)]


CAUSE = {
    "free_cruise": lambda f, v: (["the", "road", "ahead", "is", "clear"], ["the", "lane", "ahead", "is", "free"])[v],
    "follow": lambda f, v: (["a", f["noun"], "is", "ahead"], ["a", f["noun"], "leads", "the", "lane"])[v],
    "lead_braking": lambda f, v: ["the", f["noun"], "ahead", "is", "braking"],
    "stop_sign": lambda f, v: ["a", "stop", "sign", "is", "ahead"],
    "traffic_light": lambda f, v: (["the", "light", "ahead", "turned", "green"] if f.get("turned")
                                   else ["the", "light", "ahead", "is", f["light"]]),
    "pedestrian": lambda f, v: (["a", f["noun"], "may", "hide", "a", "pedestrian"] if f.get("occluded")
                                else ["a", "pedestrian", "is", "crossing"] if f.get("walking")
                                else ["a", "pedestrian", "waits", "to", "cross"]),
    "cyclist": lambda f, v: ["a", "cyclist", "rides", "ahead"],
    "obstacle": lambda f, v: (["a", "stalled", f["noun"], "is", "ahead"] if f.get("blocked")
                              else ["cones", "narrow", "the", "lane"]),
    "door_zone": lambda f, v: ["a", f["noun"], "door", "is", "open"],
    "curve": lambda f, v: ["the", "road", "curves", f["side"], "ahead"],
    "turn": lambda f, v: ["the", "road", "turns", f["side"], "ahead"],
    "cut_in": lambda f, v: ["a", f["noun"], "is", "cutting", "in"],
}
ACTION = {
    "keep_speed": (["keep", "speed"], ["hold", "the", "speed"]),
    "speed_up": (["speed", "up"], ["speed", "up"]),
    "follow": (["follow", "it"], ["keep", "the", "gap"]),
    "slow_down": (["slow", "down"], ["ease", "off"]),
    "stop": (["stop"], ["come", "to", "a", "stop"]),
    "yield": (["yield", "to", "it"], ["let", "it", "cross"]),
    "nudge_left": (["nudge", "left"], ["nudge", "left", "to", "pass"]),
    "change_lane_left": (["change", "lanes", "left"], ["move", "one", "lane", "left"]),
    "keep_lane": (["keep", "the", "lane"], ["follow", "the", "lane"]),
    "turn_left": (["turn", "left"], ["turn", "left"]),
    "turn_right": (["turn", "right"], ["turn", "right"]),
}
NOUNS = ("car", "van")
FACT_WORDS = ("red", "yellow", "green", "left", "right")


def commitment_words(family: str, facts: dict, decision: str, variant: int) -> list[str]:
    """The commitment: what the cameras show (cause) and what the ego does about it (decision)."""
    if family not in CAUSE:
        raise ValueError(f"family {family!r} has no CoC grammar; allowed: {', '.join(FAMILIES)}")
    if decision not in ACTION:
        raise ValueError(f"decision {decision!r} unknown; allowed: {', '.join(DECISIONS)}")
    return CAUSE[family](facts, variant) + [",", "so"] + ACTION[decision][variant]


def make_coc(history, family: str, facts: dict, decision: str, variant: int) -> tuple[str, list[bool]]:
    """(text, per-word routine flags): routine words first, then the commitment."""
    routine = routine_words(history, variant)
    commit = commitment_words(family, facts, decision, variant)
    return " ".join(routine + commit), [True] * len(routine) + [False] * len(commit)


def vocabulary() -> list[str]:
    """Every word the grammar can produce (sorted, no duplicates)."""
    words = set(NUMBERS) | {"ego", "is", "stopped", "driving", "moving", "at", "m/s", ",", "standing", "still",
                            "holding", "a", "steady", "speed", "speeding", "slowing", "up", "down", "from", "heading",
                            "straight", "turning", "left", "right", "deg/s", "covering", "m", "so"}
    for window in WINDOW:
        words |= set(window)
    for variants in ACTION.values():
        for phrase in variants:
            words |= set(phrase)
    for phrase in CAUSE.values():
        for noun in NOUNS:
            for fact in FACT_WORDS:
                for flags in ({}, {"occluded": True, "blocked": True, "turned": True}, {"walking": True}):
                    facts = {"noun": noun, "light": fact, "side": fact, **flags}
                    for v in (0, 1):
                        words |= set(phrase(facts, v))
    return sorted(words)
