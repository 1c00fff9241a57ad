"""Cameras and id images: causes are visible, id pixels show their agent, geometry is sane."""
import itertools

import numpy as np
import pytest

from scenes.agents import COLORS, LIGHT_COLORS, Agent, static
from scenes.config import CAMERAS, FAMILIES, HOLD_VISIBLE_PIXELS, T0_INDEX
from scenes.families import straight_road
from scenes.render import FACE_SHADE, IMAGE_H, IMAGE_W, render_frame, visible_pixels
from scenes.world import make_scene

NO_CAUSE = {"free_cruise", "curve", "turn"}
CAM = {c.name: i for i, c in enumerate(CAMERAS)}


@pytest.fixture(scope="module")
def scenes():
    return [make_scene(1000 + i, family) for family in FAMILIES for i in range(12)]


def test_images_and_ids_have_the_documented_shapes(scenes):
    s = scenes[0]
    assert s.images.shape == (4, 2, IMAGE_H, IMAGE_W, 3) and s.images.dtype == np.uint8
    assert s.ids.shape == (4, 2, IMAGE_H, IMAGE_W) and s.ids.dtype == np.int16
    assert (IMAGE_H, IMAGE_W) == (64, 96)
    moving = [s for s in scenes if np.linalg.norm(s.history[-1, :2] - s.history[-6, :2]) > 2.0]
    assert all(not np.array_equal(s.images[:, 0], s.images[:, 1]) for s in moving), "the two frames are equal"


def test_every_named_cause_is_visible_at_its_cycle(scenes):
    named = 0
    for s in scenes:
        if s.family in NO_CAUSE:
            assert s.cause is None, f"{s.family} names cause {s.cause}"
            continue
        if s.cause is None:              # not visible (or not ahead) at this cycle: the road is clear
            assert s.cause_kind == "free_cruise", (s.family, s.seed, s.cause_kind)
            continue
        named += 1
        pixels = int((s.ids[:, 1] == s.cause).sum())
        assert pixels >= HOLD_VISIBLE_PIXELS, (f"{s.family} seed {s.seed}: cause {s.agents[s.cause]['kind']} "
                                              f"covers {pixels} pixels at t, fewer than {HOLD_VISIBLE_PIXELS}")
    assert named >= len(scenes) // 3, f"only {named} of {len(scenes)} snapshots name an agent as the cause"


def _allowed_colours(kind: str) -> set:
    bases = [COLORS[kind]]
    if kind in ("car", "van"):
        bases.append((255, 0, 0))                          # brake lights
    if kind == "traffic_light":
        bases += list(LIGHT_COLORS)
    if kind == "stop_sign":
        bases.append((120, 120, 120))                      # pole
    return {tuple(np.floor(np.array(b, dtype=np.float64) * f).astype(int)) for b in bases for f in FACE_SHADE}


def test_id_pixels_show_their_agent(scenes):
    checked = 0
    for s in scenes:
        for agent in s.agents:
            mask = s.ids == agent["id"]
            if not mask.any():
                continue
            colours = {tuple(int(v) for v in c) for c in s.images[mask]}
            wrong = colours - _allowed_colours(agent["kind"])
            assert not wrong, f"seed {s.seed}: pixels of {agent['kind']} #{agent['id']} have colours {sorted(wrong)[:3]}"
            checked += int(mask.sum())
    assert checked > 10000


def _shades(rgb) -> np.ndarray:
    return np.array(rgb, dtype=np.float64)[None, :] * FACE_SHADE[:, None]


def _gap(a, b) -> float:
    """The closest two colours come under any pair of face shades (RGB distance)."""
    return float(np.linalg.norm(_shades(a)[:, None, :] - _shades(b)[None, :, :], axis=-1).min())


def test_a_stop_sign_is_as_distinct_in_colour_as_any_two_other_classes():
    """A far stop sign is a few pixels, so its face must differ in hue from a light's lamps: at
    least as much as the closest two other classes (which the target tells apart) differ."""
    classes = {k: [c] for k, c in COLORS.items() if k not in ("stop_sign", "door")}   # a door is a car's
    classes["traffic_light"] += list(LIGHT_COLORS)
    closest = min(_gap(a, b) for (k1, c1), (k2, c2) in itertools.combinations(classes.items(), 2)
                  for a in c1 for b in c2)
    for kind, colours in classes.items():
        for other in colours:
            assert _gap(COLORS["stop_sign"], other) >= closest, (
                f"stop sign face {COLORS['stop_sign']} is {_gap(COLORS['stop_sign'], other):.0f} from {kind} {other}; "
                f"the closest two other classes are {closest:.0f} apart")


def test_cheap_visibility_equals_the_rendered_id_image():
    road = straight_road()
    boxes = [(3.0, -1.75, 0.0, 0.0, 4.5, 1.9, 1.5, (1, 2, 3), 0), (12.0, -1.0, 0.0, 0.2, 4.5, 1.9, 1.5, (4, 5, 6), 1),
             (30.0, 4.0, 0.0, 0.0, 0.6, 0.6, 1.75, (7, 8, 9), 2)]
    pose = (0.0, -1.75, 0.05)
    _, ids = render_frame(pose, boxes, [road], [])
    for k in range(3):
        assert visible_pixels(pose, boxes, k) == int((ids == k).sum())
    assert (ids == 0).sum() > 0 and (ids == 1).sum() > 0


def _one_box_ids(x, y):
    car = static("car", x, y, 0.0)
    boxes = [(*b, 0) for b in car.boxes(T0_INDEX)]
    return render_frame((0.0, 0.0, 0.0), boxes, [straight_road()], [])[1]


def test_cameras_look_where_they_should():
    ahead = _one_box_ids(25.0, 0.0)
    for name in ("front_wide", "front_tele"):
        cols = np.flatnonzero((ahead[CAM[name]] == 0).any(axis=0))
        assert cols.size and abs((cols.min() + cols.max() + 1) / 2 - IMAGE_W / 2) <= 1, f"{name} columns {cols}"
    assert not (ahead[CAM["cross_left"]] == 0).any() and not (ahead[CAM["cross_right"]] == 0).any()
    left = _one_box_ids(6.0, 12.0)
    assert (left[CAM["cross_left"]] == 0).any() and not (left[CAM["cross_right"]] == 0).any()
    assert not (left[CAM["front_tele"]] == 0).any()
    cols = np.flatnonzero((left[CAM["front_wide"]] == 0).any(axis=0))
    assert cols.size == 0 or cols.max() < IMAGE_W / 2, "a car on the left shows right of centre"
    far, near = _one_box_ids(60.0, 0.0), _one_box_ids(15.0, 0.0)
    assert (near[CAM["front_tele"]] == 0).sum() > 4 * (far[CAM["front_tele"]] == 0).sum() > 0


def test_unknown_agent_kind_is_refused():
    with pytest.raises(ValueError, match="'truck'.*allowed"):
        Agent("truck", np.zeros((85, 3)))
