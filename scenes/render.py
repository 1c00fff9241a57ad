"""Pinhole cameras by ray casting in numpy: a flat ground (roads, lane marks, paint) and 3D boxes.

Each pixel centre is a ray from the camera. The ground is the plane z = 0, shaded by the road
geometry at the hit point; agents are oriented boxes hit by the slab test, only over the pixels
inside each box's projected bounding rectangle. The id image holds, per pixel, the index of the
agent whose box is nearest (-1 for ground and sky). The ground never hides a box (boxes stand
on it), so the id image is occlusion-correct among the boxes.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from scenes.config import CAMERA_MOUNT, CAMERAS
from scenes.geometry import SHOULDER, SIDEWALK

IMAGE_H, IMAGE_W = 64, 96
SKY, HAZE = np.array([150, 190, 235.0]), np.array([200, 205, 215.0])
GRASS, PAVEMENT = np.array([75, 125, 60.0]), np.array([170, 170, 165.0])
ASPHALT, SHOULDER_RGB = np.array([80, 80, 86.0]), np.array([100, 100, 104.0])
WHITE, YELLOW = np.array([240, 240, 240.0]), np.array([235, 200, 40.0])
MARK_HALF = 0.15                 # m, half width of painted lines (wide enough to show at 64 x 96)
FACE_SHADE = np.array([0.85, 0.7, 1.0])   # x faces, y faces, top


@lru_cache(maxsize=4)
def camera_basis(h: int, w: int):
    """Per camera: focal length (px) and the vehicle-frame forward, left, up unit vectors."""
    out = []
    for cam in CAMERAS:
        yaw, pitch = np.radians(cam.yaw_deg), np.radians(cam.pitch_deg)
        f = (w / 2) / np.tan(np.radians(cam.hfov_deg) / 2)
        fwd = np.array([np.cos(pitch) * np.cos(yaw), np.cos(pitch) * np.sin(yaw), -np.sin(pitch)])
        left = np.array([-np.sin(yaw), np.cos(yaw), 0.0])
        up = np.array([np.sin(pitch) * np.cos(yaw), np.sin(pitch) * np.sin(yaw), np.cos(pitch)])
        out.append((f, fwd, left, up))
    return out


def views(ego_pose, h: int = IMAGE_H, w: int = IMAGE_W) -> list:
    """Per camera at one ego pose: (origin (3,), f, fwd, left, up) in the world frame."""
    x, y, th = ego_pose
    c, s = np.cos(th), np.sin(th)
    rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])
    mx, my, mz = CAMERA_MOUNT
    origin = np.array([x + c * mx - s * my, y + s * mx + c * my, mz])
    return [(origin, f, rot @ fwd, rot @ left, rot @ up) for f, fwd, left, up in camera_basis(h, w)]


def project(view, points: np.ndarray, h: int, w: int):
    """World points (M, 3) -> pixel (u, v) and depth along the optical axis."""
    origin, f, fwd, left, up = view
    rel = points - origin
    z = rel @ fwd
    zs = np.where(z > 1e-3, z, 1e-3)
    return f * -(rel @ left) / zs + w / 2, f * -(rel @ up) / zs + h / 2, z


def box_corners3d(box) -> np.ndarray:
    x, y, z0, yaw, l, w_, h = box[:7]
    lx = np.array([1, 1, -1, -1, 1, 1, -1, -1]) * l / 2
    ly = np.array([1, -1, -1, 1, 1, -1, -1, 1]) * w_ / 2
    lz = z0 + np.array([0, 0, 0, 0, 1, 1, 1, 1]) * h
    c, s = np.cos(yaw), np.sin(yaw)
    return np.stack([x + c * lx - s * ly, y + s * lx + c * ly, lz], axis=1)


def pixel_rect(view, box, h: int, w: int):
    """(r0, r1, c0, c1) rows/cols that can see the box, or None when it is behind the camera."""
    u, v, z = project(view, box_corners3d(box), h, w)
    if (z <= 0.05).all():
        return None
    if (z <= 0.05).any():
        return 0, h, 0, w
    c0, c1 = int(max(np.floor(u.min() - 0.5), 0)), int(min(np.ceil(u.max() + 0.5), w))
    r0, r1 = int(max(np.floor(v.min() - 0.5), 0)), int(min(np.ceil(v.max() + 0.5), h))
    return (r0, r1, c0, c1) if r1 > r0 and c1 > c0 else None


def hit_box(origin, dirs, box):
    """Slab test: distance along each ray to the box (inf on a miss) and the face hit (0, 1, 2)."""
    x, y, z0, yaw, l, w_, h = box[:7]
    c, s = np.cos(yaw), np.sin(yaw)
    o = np.array([c * (origin[0] - x) + s * (origin[1] - y), -s * (origin[0] - x) + c * (origin[1] - y),
                  origin[2] - z0 - h / 2])
    d = np.stack([c * dirs[:, 0] + s * dirs[:, 1], -s * dirs[:, 0] + c * dirs[:, 1], dirs[:, 2]], axis=1)
    d = np.where(np.abs(d) < 1e-12, 1e-12, d)
    half = np.array([l / 2, w_ / 2, h / 2])
    t1, t2 = (-half - o) / d, (half - o) / d
    near, far = np.minimum(t1, t2), np.maximum(t1, t2)
    t_near, t_far = near.max(axis=1), far.min(axis=1)
    hit = (t_far >= np.maximum(t_near, 0.0)) & (t_near > 0.0)
    return np.where(hit, t_near, np.inf), near.argmax(axis=1)


def ground_rgb(px, py, dist, roads, paint) -> np.ndarray:
    """Colour of ground points (P,) from the roads' (s, d), lane marks and painted rectangles."""
    rgb = np.broadcast_to(GRASS, (len(px), 3)).copy()
    n_cover = np.zeros(len(px), dtype=np.int64)
    marks = np.zeros(len(px), dtype=np.int64)           # 0 none, 1 white, 2 yellow
    for road in roads:
        s, d, inside = road.frenet(px, py)
        ad, hw = np.abs(d), road.half_width
        rgb[inside & (ad < hw + SHOULDER + SIDEWALK) & (n_cover == 0)] = PAVEMENT
        on = inside & (ad < hw + SHOULDER)
        rgb[on & (ad >= hw)] = SHOULDER_RGB
        rgb[on & (ad < hw)] = ASPHALT
        n_cover += on
        edge = np.abs(ad - hw) < MARK_HALF
        divider = (road.lanes > 1) & (np.abs(ad - hw / 2) < MARK_HALF) & (np.mod(s, 9.0) < 3.0)
        marks = np.where(on & (edge | divider), 1, marks)
        marks = np.where(on & (ad < MARK_HALF) & (np.mod(s, 9.0) < 4.0), 2, marks)   # dashed centre line
    one = n_cover == 1                                   # no lines inside junctions
    rgb[one & (marks == 1)] = WHITE
    rgb[one & (marks == 2)] = YELLOW
    for x, y, yaw, length, width, color in paint:
        c, s = np.cos(yaw), np.sin(yaw)
        u, v = c * (px - x) + s * (py - y), -s * (px - x) + c * (py - y)
        rgb[(np.abs(u) < length / 2) & (np.abs(v) < width / 2)] = color
    fog = np.clip((dist - 60.0) / 160.0, 0.0, 0.75)[:, None]
    return rgb * (1 - fog) + HAZE * fog


GROUND_SUBROWS = (-0.25, 0.25)   # ground colour = mean of two sub-rows per pixel (less aliasing)


@lru_cache(maxsize=4)
def _vehicle_rays(h: int, w: int, dv: float = 0.0) -> np.ndarray:
    """(C, P, 3) ray directions in the vehicle frame (heading 0), pixel centres shifted dv rows."""
    out = []
    for f, fwd, left, up in camera_basis(h, w):
        u = (np.arange(w) + 0.5 - w / 2) / f
        v = (np.arange(h) + 0.5 + dv - h / 2) / f
        uu, vv = np.meshgrid(u, v)
        out.append(fwd + (-uu.reshape(-1, 1)) * left + (-vv.reshape(-1, 1)) * up)
    return np.stack(out)


@lru_cache(maxsize=8)
def _ground_samples(h: int, w: int, dv: float):
    """Rays that hit z = 0: mask (C, P), hit points (G, 2) in the vehicle frame, distance (G,), and
    the sky colour (C, P, 3). The ground is flat, so all of this is the same at every ego pose."""
    d = _vehicle_rays(h, w, dv)
    mx, my, mz = CAMERA_MOUNT
    mask = d[..., 2] < -1e-6
    t = mz / -d[..., 2][mask]
    hit = np.array([mx, my]) + d[mask][:, :2] * t[:, None]
    up = np.clip(d[..., 2] * 4.0, 0.0, 1.0)[..., None]          # hazy at the horizon, blue above
    return mask, hit, t, SKY * up + HAZE * (1 - up)


def _rotate(xy: np.ndarray, th: float) -> np.ndarray:
    c, s = np.cos(th), np.sin(th)
    return np.stack([c * xy[..., 0] - s * xy[..., 1], s * xy[..., 0] + c * xy[..., 1]], axis=-1)


def world_rays(ego_pose, h: int = IMAGE_H, w: int = IMAGE_W) -> np.ndarray:
    """(C, P, 3) world ray directions through the pixel centres at an ego pose."""
    d = _vehicle_rays(h, w)
    return np.concatenate([_rotate(d[..., :2], ego_pose[2]), d[..., 2:]], axis=-1)


def render_frame(ego_pose, boxes, roads, paint, h: int = IMAGE_H, w: int = IMAGE_W):
    """All cameras at one ego pose -> rgb (C, h, w, 3) uint8 and ids (C, h, w) int16.

    boxes: list of (x, y, z0, yaw, length, width, height, rgb, agent_id) in the world frame.
    """
    x, y, th = ego_pose
    rgb = 0.0
    for dv in GROUND_SUBROWS:
        mask, hit, dist, sky = _ground_samples(h, w, dv)
        layer = sky.copy()
        world = _rotate(hit, th) + np.array([x, y])
        layer[mask] = ground_rgb(world[:, 0], world[:, 1], dist, roads, paint)
        rgb = rgb + layer / len(GROUND_SUBROWS)
    dirs = world_rays(ego_pose, h, w)
    ids = np.full(dirs.shape[:2], -1, dtype=np.int16)
    for ci, view in enumerate(views(ego_pose, h, w)):
        depth = np.full(h * w, np.inf)
        for box in boxes:
            rect = pixel_rect(view, box, h, w)
            if rect is None:
                continue
            idx = _rect_indices(rect, w)
            t, face = hit_box(view[0], dirs[ci, idx], box)
            closer = t < depth[idx]
            sel = idx[closer]
            depth[sel] = t[closer]
            rgb[ci, sel] = np.asarray(box[7], dtype=np.float64) * FACE_SHADE[face[closer]][:, None]
            ids[ci, sel] = box[8]
    return np.clip(rgb, 0, 255).astype(np.uint8).reshape(-1, h, w, 3), ids.reshape(-1, h, w)


def visible_pixels(ego_pose, boxes, agent_id: int, h: int = IMAGE_H, w: int = IMAGE_W) -> int:
    """Pixels of agent_id in the id images of all cameras at one pose (same maths as render_frame)."""
    mine = [b for b in boxes if b[8] == agent_id]
    total = 0
    dirs = world_rays(ego_pose, h, w)
    for ci, view in enumerate(views(ego_pose, h, w)):
        rects = [r for r in (pixel_rect(view, b, h, w) for b in mine) if r is not None]
        if not rects:
            continue
        rect = (min(r[0] for r in rects), max(r[1] for r in rects), min(r[2] for r in rects), max(r[3] for r in rects))
        idx = _rect_indices(rect, w)
        d = dirs[ci, idx]
        depth, owner = np.full(len(idx), np.inf), np.full(len(idx), -1)
        for box in boxes:
            t, _ = hit_box(view[0], d, box)
            closer = t < depth
            depth, owner = np.where(closer, t, depth), np.where(closer, box[8], owner)
        total += int((owner == agent_id).sum())
    return total


def _rect_indices(rect, w: int) -> np.ndarray:
    r0, r1, c0, c1 = rect
    return (np.arange(r0, r1)[:, None] * w + np.arange(c0, c1)[None, :]).reshape(-1)
