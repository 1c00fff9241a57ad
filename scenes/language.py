"""The chain-of-causation language of world v2: clauses, their paraphrases, and a parser.

A CoC is clauses separated by " , ":

    routine clauses    speed first, then trend / heading / distance (some optional): the content
                       is a function of the ego history only, and so is the habitual wording
    commitment         the cause clause (what the cameras show: which agent, where, how far,
                       what it does), optional detail clauses (time gap or time to collision,
                       the lane, other traffic, brake lights), then "so" + the action clause
                       with an optional hedge

Every clause has at least four paraphrases, and the phrasing (which paraphrase, which optional
clauses, their order) is drawn from a generator per sample. In the commitment it is drawn
uniformly, never from the inputs, so at those points the target's distribution is spread the way
a real VLA's is and a draft must match a near-tie argmax. The routine part is habitual, the way a
driver's running commentary is: with probability P_HABIT each routine choice takes the habit of
the history's speed band (a paraphrase per band, the window suffix while accelerating or braking,
the distance clause above DISTANCE_HABIT m, the fixed clause order), else it is drawn uniformly.
So what the routine part says, and most of how, is a function of the history the draft reads.
Numbers carry one decimal.

Templates are word lists with slots: {num} a number ("12.3" or "12"), {noun} a vehicle noun,
{side} left/right, {light} red/yellow/green. `parse(words)` reads a CoC back into its clauses
(kind, key, slot values): grading and the routine/commitment split use it, so any paraphrase
the grammar can produce is graded the same.
"""
from __future__ import annotations

import re

import numpy as np

from scenes.config import DECISIONS, DT

NOUNS = ("car", "van")
SIDES = ("left", "right")
LIGHTS = ("red", "yellow", "green")
SLOT_VALUES = {"{noun}": NOUNS, "{side}": SIDES, "{light}": LIGHTS}
NUMBER = re.compile(r"^\d+(\.\d)?$")

# routine clauses: key -> paraphrases (content from the history only)
ROUTINE = {
    "speed": ("ego is driving at {num} m/s", "ego is moving at {num} m/s", "ego is cruising at {num} m/s",
              "the ego vehicle travels at {num} m/s", "ego speed is {num} m/s"),
    "stopped": ("ego is stopped", "ego is standing still", "ego is at a standstill", "the ego vehicle is not moving"),
    "still": ("not moving for 1.5 s", "still for the past 1.5 s", "without moving in the last 1.5 s",
              "parked for at least 1.5 s"),
    "steady": ("holding a steady speed", "keeping a constant speed", "at a steady pace", "with no change in speed"),
    "accel": ("speeding up from {num} m/s", "accelerating from {num} m/s", "picking up speed from {num} m/s",
              "gaining speed from {num} m/s"),
    "decel": ("slowing down from {num} m/s", "decelerating from {num} m/s", "braking from {num} m/s",
              "losing speed from {num} m/s"),
    "straight": ("heading straight", "going straight", "driving straight ahead", "keeping a straight line"),
    "turning": ("turning {side} at {num} deg/s", "steering {side} at {num} deg/s", "yawing {side} at {num} deg/s",
                "bearing {side} at {num} deg/s"),
    "distance": ("covering {num} m", "having covered {num} m", "{num} m travelled", "after {num} m of driving"),
}
WINDOW = ("over the last 1.5 s", "in the past 1.5 s", "during the last 1.5 s", "within 1.5 s")

# cause clauses: kind -> paraphrases (what the cameras show)
CAUSE = {
    "free_cruise": ("the road ahead is clear", "the lane ahead is free", "nothing is ahead",
                    "there is no traffic ahead", "the way ahead is open"),
    "follow": ("a {noun} is {num} m ahead", "a {noun} leads {num} m ahead", "there is a {noun} {num} m ahead",
               "a {noun} drives {num} m ahead of us"),
    "lead_braking": ("the {noun} {num} m ahead is braking", "the {noun} ahead brakes at {num} m",
                     "a {noun} {num} m ahead is slowing hard", "the lead {noun} is braking {num} m ahead"),
    "lead_stopped": ("the {noun} {num} m ahead has stopped", "a stopped {noun} is {num} m ahead",
                     "the lead {noun} stands still {num} m ahead", "a {noun} waits {num} m ahead"),
    "stop_sign": ("a stop sign is {num} m ahead", "there is a stop sign in {num} m", "a stop sign stands {num} m ahead",
                  "the stop line is {num} m ahead"),
    "light": ("the light {num} m ahead is {light}", "a {light} light is {num} m ahead", "the signal ahead shows {light}",
              "the traffic light ahead is {light}"),
    "light_turned": ("the light ahead turned green", "the light just turned green", "the signal changed to green",
                     "the traffic light is green again"),
    "pedestrian_crossing": ("a pedestrian is crossing {num} m ahead", "a pedestrian crosses the road {num} m ahead",
                            "someone is walking across {num} m ahead", "a person is on the crosswalk {num} m ahead"),
    "pedestrian_waiting": ("a pedestrian waits to cross {num} m ahead", "a pedestrian stands at the crosswalk {num} m ahead",
                           "someone is about to cross {num} m ahead", "a person waits at the curb {num} m ahead"),
    "pedestrian_hidden": ("a parked {noun} may hide a pedestrian", "a {noun} blocks the view of the crosswalk",
                          "the crosswalk is hidden behind a {noun}", "a pedestrian could step out behind a {noun}"),
    "cyclist": ("a cyclist rides {num} m ahead", "there is a cyclist {num} m ahead", "a bike is {num} m ahead on the right",
                "a cyclist keeps right {num} m ahead"),
    "stalled": ("a stalled {noun} blocks the lane {num} m ahead", "a broken down {noun} is {num} m ahead",
                "the lane is blocked by a {noun} {num} m ahead", "a {noun} stands in our lane {num} m ahead"),
    "cones": ("cones narrow the lane {num} m ahead", "there are cones {num} m ahead", "road works cones are {num} m ahead",
              "the lane is coned off {num} m ahead"),
    "door": ("a {noun} door is open {num} m ahead", "a parked {noun} has its door open",
             "an open {noun} door is {num} m ahead", "a door of a parked {noun} opens into the lane"),
    "curve": ("the road curves {side} ahead", "a {side} bend is {num} m ahead", "the road bends {side} in {num} m",
              "a {side} curve comes up"),
    "turn": ("the road turns {side} ahead", "the road ends in a {side} turn", "a {side} turn is {num} m ahead",
             "the junction ahead turns {side}"),
    "cut_in": ("a {noun} is cutting in {num} m ahead", "a {noun} merges into our lane {num} m ahead",
               "the {noun} on the left cuts in", "a {noun} moves into the lane {num} m ahead"),
}
CAUSE_SLOTS = {k: sorted({s for p in v for s in SLOT_VALUES if s in p}) for k, v in CAUSE.items()}

# detail clauses (optional, commitment side)
DETAIL = {
    "gap": ("with a time gap of {num} s", "at a {num} s gap", "{num} s behind it", "keeping {num} s of headway"),
    "ttc": ("time to collision is {num} s", "closing in {num} s", "{num} s to contact", "with {num} s to collision"),
    "lane": ("ego is in the right lane", "we keep the right lane", "in the right lane", "staying in the right lane"),
    "oncoming": ("oncoming traffic in the other lane", "a car is coming the other way", "an oncoming car passes",
                 "traffic comes the other way"),
    "parked": ("cars are parked on the right", "parked cars line the right side", "the right shoulder has parked cars",
               "there are parked cars on the right"),
    "brake_lights": ("its brake lights are on", "brake lights are on", "the brake lights show red",
                     "its brake lights light up"),
}
ACTION = {
    "keep_speed": ("keep speed", "hold the speed", "keep going", "maintain speed"),
    "speed_up": ("speed up", "accelerate", "pick up speed", "go faster"),
    "follow": ("follow it", "keep the gap", "stay behind it", "follow at a safe gap"),
    "slow_down": ("slow down", "ease off", "reduce speed", "brake gently"),
    "stop": ("stop", "come to a stop", "halt", "brake to a stop"),
    "yield": ("yield to it", "let it cross", "give way", "wait for it to cross"),
    "nudge_left": ("nudge left", "nudge left to pass", "shift left a little", "move over to the left"),
    "change_lane_left": ("change lanes left", "move one lane left", "switch to the left lane", "pass in the left lane"),
    "keep_lane": ("keep the lane", "follow the lane", "stay in lane", "keep to the lane"),
    "turn_left": ("turn left", "take the left turn", "make a left turn", "go left"),
    "turn_right": ("turn right", "take the right turn", "make a right turn", "go right"),
}
HEDGES = ("for now", "to be safe", "as a precaution", "smoothly")

P_DETAIL, P_HEDGE = 0.35, 0.3
P_HABIT = 0.85                   # a routine choice follows the history's habit with this probability
SPEED_BAND = 4.0                 # m/s per band of the routine habit
ACCEL_HABIT = 1.0                # m/s^2: the window suffix is habitual above this |accel|
DISTANCE_HABIT = 12.0            # m: the distance clause is habitual above this distance


def num(x: float, decimals: int = 1) -> str:
    """A number as the CoC writes it: one decimal (or none), never negative, never "-0.0"."""
    return f"{max(float(x), 0.0):.{decimals}f}"


def fill(template: str, slots: dict) -> list[str]:
    """Template words with slots filled: {num} takes slots['num'] (a string), others by name."""
    out = []
    for w in template.split():
        if w.startswith("{"):
            key = w.strip("{}")
            if key not in slots:
                raise ValueError(f"template {template!r} needs slot {key!r}; given {sorted(slots)}")
            out.append(str(slots[key]))
        else:
            out.append(w)
    return out


# ---------------------------------------------------------------- routine part


def history_facts(history) -> dict:
    """Speed now (m/s), mean accel (m/s^2), yaw rate (deg/s), distance (m) of a (16, 3) history."""
    h = np.asarray(history, dtype=np.float64)
    speed = np.hypot(np.diff(h[:, 0]), np.diff(h[:, 1])) / DT          # (15,) per step
    accel = (speed[-3:].mean() - speed[:3].mean()) / (12 * DT)        # window centres 1.2 s apart
    heading = np.unwrap(h[:, 2])
    yaw_rate = np.degrees(heading[-1] - heading[-6]) / (5 * DT)
    return {"speed": float(speed[-1]), "max_speed": float(speed.max()), "accel": float(accel),
            "yaw_rate": float(yaw_rate), "distance": float(speed.sum() * DT)}


def speed_band(speed: float) -> int:
    """The routine habit's band of a speed (0 .. 4)."""
    return min(int(max(speed, 0.0) // SPEED_BAND), 4)


def routine_clauses(history, rng) -> list[list[str]]:
    """The routine clauses: what they say is a function of the history; how, of the history's
    habit (P_HABIT) or else of rng."""
    f = history_facts(history)
    band = speed_band(f["max_speed"])
    habit = lambda: rng.random() < P_HABIT                                  # noqa: E731

    def pick(options):
        return options[band % len(options)] if habit() else options[int(rng.integers(len(options)))]

    def keep(habitual: bool) -> bool:
        return habit() == habitual

    if f["speed"] < 0.3:
        first = fill(pick(ROUTINE["stopped"]), {})
    else:
        first = fill(pick(ROUTINE["speed"]), {"num": num(f["speed"])})
    if f["max_speed"] < 0.3:
        trend = fill(pick(ROUTINE["still"]), {})
    elif abs(f["accel"]) < 0.4:
        trend = fill(pick(ROUTINE["steady"]), {})
    else:
        start = f["speed"] - f["accel"] * 15 * DT            # speed 1.5 s ago at the mean accel
        trend = fill(pick(ROUTINE["accel" if f["accel"] > 0 else "decel"]), {"num": num(start)})
    if f["max_speed"] >= 0.3 and keep(abs(f["accel"]) >= ACCEL_HABIT):
        trend += pick(WINDOW).split()
    rate = f["yaw_rate"]
    if abs(rate) < 2.0:
        heading = fill(pick(ROUTINE["straight"]), {})
    else:
        heading = fill(pick(ROUTINE["turning"]), {"side": "left" if rate > 0 else "right", "num": num(abs(rate), 0)})
    rest = [trend, heading]
    if f["distance"] >= 0.3 and keep(f["distance"] >= DISTANCE_HABIT):
        rest.append(fill(pick(ROUTINE["distance"]), {"num": num(f["distance"])}))
    order = np.arange(len(rest)) if habit() else rng.permutation(len(rest))
    return [first] + [rest[i] for i in order]


# ---------------------------------------------------------------- commitment


def cause_clause(kind: str, facts: dict, rng) -> list[str]:
    if kind not in CAUSE:
        raise ValueError(f"cause kind {kind!r} has no clause; allowed: {', '.join(CAUSE)}")
    options = CAUSE[kind]
    slots = {"num": num(facts.get("distance", 0.0))}
    slots.update({k: facts[k] for k in ("noun", "side", "light") if k in facts})
    return fill(options[int(rng.integers(len(options)))], slots)


def commitment_clauses(kind: str, facts: dict, decision: str, details: dict, rng) -> list[list[str]]:
    """Cause, optional details (a dict key -> {num} value or None, each kept with P_DETAIL), action."""
    if decision not in ACTION:
        raise ValueError(f"decision {decision!r} unknown; allowed: {', '.join(DECISIONS)}")
    clauses = [cause_clause(kind, facts, rng)]
    extra = [k for k in DETAIL if k in details and rng.random() < P_DETAIL]
    for k in (extra[i] for i in rng.permutation(len(extra))):
        options = DETAIL[k]
        value = details[k]
        clauses.append(fill(options[int(rng.integers(len(options)))], {} if value is None else {"num": value}))
    action = ["so"] + ACTION[decision][int(rng.integers(len(ACTION[decision])))].split()
    if rng.random() < P_HEDGE:
        action += HEDGES[int(rng.integers(len(HEDGES)))].split()
    return clauses + [action]


def make_coc(history, kind: str, facts: dict, decision: str, details: dict, rng) -> tuple[str, list[bool]]:
    """(text, per-word routine flags): routine clauses first, then the commitment."""
    routine = routine_clauses(history, rng)
    commit = commitment_clauses(kind, facts, decision, details, rng)
    words, flags = [], []
    for i, clause in enumerate(routine + commit):
        piece = clause + ([","] if i < len(routine) + len(commit) - 1 else [])
        words += piece
        flags += [i < len(routine)] * len(piece)
    return " ".join(words), flags


# ---------------------------------------------------------------- parsing and grading


def _match(template: str, words: list[str]) -> dict | None:
    parts = template.split()
    if len(parts) != len(words):
        return None
    slots = {}
    for p, w in zip(parts, words):
        if p == "{num}":
            if not NUMBER.match(w):
                return None
            slots["num"] = float(w)
        elif p in SLOT_VALUES:
            if w not in SLOT_VALUES[p]:
                return None
            slots[p.strip("{}")] = w
        elif p != w:
            return None
    return slots


def _tables():
    yield "routine", ROUTINE
    yield "cause", CAUSE
    yield "detail", DETAIL


def classify(clause: list[str]) -> tuple[str, str, dict] | None:
    """(part, key, slots) of one clause: part routine / cause / detail / action; None if unknown."""
    if clause and clause[0] == "so":
        body = clause[1:]
        for decision, options in ACTION.items():
            for phrase in options:
                n = len(phrase.split())
                if body[:n] == phrase.split() and (len(body) == n or " ".join(body[n:]) in HEDGES):
                    return "action", decision, {}
        return None
    for part, table in _tables():
        for key, options in table.items():
            for t in options:
                slots = _match(t, clause)
                if slots is not None:
                    return part, key, slots
        if part == "routine":       # a trend clause with its window suffix
            for key in ("steady", "accel", "decel"):
                for t in ROUTINE[key]:
                    for w in WINDOW:
                        slots = _match(f"{t} {w}", clause)
                        if slots is not None:
                            return part, key, slots
    return None


def clauses_of(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w == ",":
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out + [cur] if cur else out


def parse(words: list[str]) -> list[tuple[str, str, dict] | None]:
    """One (part, key, slots) or None per clause of a CoC's words."""
    return [classify(c) for c in clauses_of(words)]


def routine_length(words: list[str]) -> int:
    """Number of leading words that are routine clauses (their commas included)."""
    n = 0
    for clause, parsed in zip(clauses_of(words), parse(words)):
        if parsed is None or parsed[0] != "routine":
            break
        n += len(clause) + 1
    return min(n, len(words))


def read_commitment(words: list[str]) -> tuple[tuple | None, str | None]:
    """((cause kind, non-number slots) or None, decision or None) of a CoC's words: the first cause
    clause and the last action clause."""
    cause, decision = None, None
    for parsed in parse(words):
        if parsed is None:
            continue
        part, key, slots = parsed
        if part == "cause" and cause is None:
            cause = (key, tuple(sorted((k, v) for k, v in slots.items() if k != "num")))
        elif part == "action":
            decision = key
    return cause, decision


def cause_key(kind: str, facts: dict) -> tuple:
    """The canonical identity of a cause: its kind and the non-number slots its clauses name
    (what `read_commitment` returns for any paraphrase of it)."""
    names = [slot.strip("{}") for slot in CAUSE_SLOTS[kind]]
    return (kind, tuple(sorted((k, facts[k]) for k in names)))


def canonical_cause_words(kind: str, facts: dict) -> list[str]:
    """The first paraphrase of a cause without its number: the cause's words for probes and keys."""
    return [w for w in fill(CAUSE[kind][0], {"num": "#", **{k: facts.get(k, "") for k in ("noun", "side", "light")}})
            if w != "#"]


def vocabulary_texts() -> list[str]:
    """Every fixed phrase of the grammar with its slot values: a corpus seed for the tokenizer."""
    texts = []
    for table in (ROUTINE, CAUSE, DETAIL):
        for options in table.values():
            texts += list(options)
    texts += list(WINDOW) + list(HEDGES) + [p for v in ACTION.values() for p in v]
    return texts + list(NOUNS + SIDES + LIGHTS)
