"""GIFs of closed-loop drives: one panel per mode, side by side, a frame every EVERY ticks.

A panel is the bird's-eye view in the ego frame of that instant (roads, stop lines, agents, the
ego and its trail), the plan in force (solid green), the plan being computed (dashed orange,
drawn where it was made, it takes over when its latency has passed), the CoC of the plan in
force, and a latency bar: the cycle in flight, its elapsed part, and 100 ms marks.
"""
from __future__ import annotations

import textwrap

import numpy as np

from scenes.agents import COLORS, LIGHT_COLORS
from bench.drive.ego_path import to_world
from scenes.config import DT, EGO_LENGTH, EGO_WIDTH
from scenes.drive import to_ego
from scenes.geometry import box_corners

EVERY = 2
VIEW = (-12.0, 12.0, -10.0, 50.0)       # m right of the ego, m ahead of it: forward is up


def _up(p: np.ndarray) -> tuple:
    """Ego-frame (..., >=2) points -> plot coordinates with forward up: (right, ahead)."""
    return -p[..., 1], p[..., 0]


def _rgb(c) -> tuple:
    return tuple(v / 255 for v in c)


def _poly(ax, x, y, yaw, length, width, color, origin, **kw):
    c = box_corners(np.array(x), np.array(y), np.array(yaw), np.array(length), np.array(width))
    ax.fill(*_up(to_ego(np.column_stack([c, np.zeros(4)]), origin)), color=color, **kw)


def _roads(ax, scen, origin) -> None:
    for road in scen.roads:
        s = np.arange(0.0, road.length, 1.0)
        for d, style in ((road.half_width, "-"), (-road.half_width, "-"), (0.0, ":")):
            x, y, th = road.pose(s, d)
            ax.plot(*_up(to_ego(np.column_stack([x, y, th]), origin)), style, color="0.55", lw=0.8)
    for x, y, yaw, length, width, rgb in scen.paint:
        _poly(ax, x, y, yaw, length, width, _rgb(rgb), origin)


def _agents(ax, scen, step: int, origin) -> None:
    for a in scen.agents:
        x, y, yaw = a.poses[step]
        color = _rgb(LIGHT_COLORS[int(a.light[step])] if a.kind == "traffic_light" else COLORS[a.kind])
        size = (1.2, 1.2) if a.kind == "traffic_light" else a.size[:2]
        _poly(ax, x, y, yaw, *size, color, origin)


def _plan(ax, cycle: dict | None, origin, **style) -> None:
    if cycle is None or cycle["trajectory"] is None:
        return
    ax.plot(*_up(to_ego(to_world(np.asarray(cycle["trajectory"]), np.asarray(cycle["origin"])), origin)), **style)


def _state(cycles: list[dict], step: int) -> tuple:
    """(the cycle whose plan is in force at `step`, the cycle in flight at `step`)."""
    force = [c for c in cycles if c["in_force"] <= step and c["trajectory"] is not None]
    flight = [c for c in cycles if c["start"] <= step < c["in_force"]]
    return (force[-1] if force else None), (flight[-1] if flight else None)


def _panel(fig, grid, col: int, case, rec: dict, step: int, lat_max: float) -> None:
    first = case.first
    ego = np.asarray(rec["ego_world"])
    origin = ego[step - first]
    ax = fig.add_subplot(grid[0, col])
    _roads(ax, case.scenario, origin)
    _agents(ax, case.scenario, step, origin)
    ax.plot(*_up(to_ego(ego[: step - first + 1], origin)), color="0.2", lw=1.0)
    force, flight = _state(rec["cycle_log"], step)
    _plan(ax, force, origin, color="tab:green", lw=2.0)
    _plan(ax, flight, origin, color="tab:orange", lw=1.5, ls="--")
    hit = any(e["step"] <= step for e in rec["metrics"]["collision_events"])
    _poly(ax, 0.0, 0.0, 0.0, EGO_LENGTH, EGO_WIDTH, "red" if hit else "black", np.zeros(3))
    ax.set_xlim(VIEW[0], VIEW[1])
    ax.set_ylim(VIEW[2], VIEW[3])
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{rec['mode']}" + ("  COLLISION" if hit else ""), fontsize=9, color="red" if hit else "black")
    txt = fig.add_subplot(grid[1, col])
    txt.axis("off")
    coc = force["coc"] if force else "(hold speed: no plan yet)"
    txt.text(0, 1, textwrap.fill(coc, 40), fontsize=6, va="top", family="monospace")
    bar = fig.add_subplot(grid[2, col])
    if flight is not None:
        elapsed = min((step - flight["start"]) * DT * 1e3, flight["latency_ms"])
        bar.barh(0, flight["latency_ms"], color="0.85")
        bar.barh(0, elapsed, color="tab:orange")
    for t in np.arange(100.0, lat_max + 1, 100.0):
        bar.axvline(t, color="0.4", lw=0.5)
    bar.set_xlim(0, lat_max)
    bar.set_yticks([])
    bar.tick_params(labelsize=6)
    bar.set_xlabel(f"cycle in flight: {flight['latency_ms']:.0f} ms" if flight else "no cycle in flight",
                   fontsize=7)


def draw_case(case, records: list[dict], out_path, every: int = EVERY) -> int:
    """One GIF of a drive, a panel per mode record -> frames written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    lat_max = max(max((c["latency_ms"] for c in r["cycle_log"]), default=100.0) for r in records)
    lat_max = 100.0 * np.ceil(max(lat_max, 100.0) / 100.0)
    frames = []
    for step in range(case.first, case.last + 1, every):
        fig = plt.figure(figsize=(2.5 * len(records), 5.4), dpi=72)
        grid = fig.add_gridspec(3, len(records), height_ratios=[5.0, 0.9, 0.3], hspace=0.2, wspace=0.08,
                                left=0.02, right=0.98, top=0.85, bottom=0.08)
        for col, rec in enumerate(records):
            _panel(fig, grid, col, case, rec, step, lat_max)
        t = (step - case.first) * DT
        fig.suptitle(f"{case.name}   t = {t:4.1f} s   latency {records[0]['latency']}\n"
                     "green: plan in force, orange: plan being computed", fontsize=8.5)
        fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).convert(
            "P", palette=Image.Palette.ADAPTIVE, colors=96))
        plt.close(fig)
    frames[0].save(out_path, save_all=True, append_images=frames[1:], duration=int(100 * every), loop=0,
                   optimize=True)
    return len(frames)
