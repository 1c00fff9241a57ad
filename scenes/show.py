"""Pictures of the world: one scene (the 4 cameras at both frames, the id images, a bird's-eye view
with history, expert future, agents and lanes, and the CoC with routine and commitment words
apart), and a drive as an animated GIF (cameras, bird's-eye view and the CoC of every cycle)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Polygon  # noqa: E402

from scenes.agents import COLORS  # noqa: E402
from scenes.config import CAMERAS, EGO_LENGTH, EGO_WIDTH, FRAME_OFFSETS, LANE_WIDTH  # noqa: E402
from scenes.geometry import SHOULDER, Road, box_corners  # noqa: E402

ROUTINE_RGB, COMMIT_RGB = "#4a6fa5", "#d9480f"


def draw(scene, out_path) -> None:
    """Write the picture of `scene` (with images) to out_path (PNG)."""
    if scene.images is None:
        raise ValueError("this scene has no images; make it with render=True or load it from a dataset")
    fig = plt.figure(figsize=(12, 11), dpi=100)
    grid = fig.add_gridspec(5, 4, height_ratios=[1, 1, 1, 1.7, 0.45], hspace=0.25, wspace=0.04,
                            left=0.04, right=0.98, top=0.97, bottom=0.02)
    for c, cam in enumerate(CAMERAS):
        for f, back in enumerate(FRAME_OFFSETS):
            ax = fig.add_subplot(grid[f, c])
            ax.imshow(scene.images[c, f], interpolation="nearest")
            ax.set_title(f"{cam.name}  t0-{back * 0.1:.1f}s" if back else f"{cam.name}  t0", fontsize=8)
            ax.axis("off")
        ax = fig.add_subplot(grid[2, c])
        ax.imshow(_id_colors(scene.ids[c, -1], scene.cause), interpolation="nearest")
        ax.set_title(f"{cam.name} ids at t0", fontsize=8)
        ax.axis("off")
    _bev(fig.add_subplot(grid[3, :]), scene)
    _coc(fig.add_subplot(grid[4, :]), scene)
    fig.savefig(out_path)
    plt.close(fig)


def _id_colors(ids: np.ndarray, cause) -> np.ndarray:
    """Agent ids as colours: each id a fixed hue, the cause white, nothing dark grey."""
    rgb = np.full(ids.shape + (3,), 40, dtype=np.uint8)
    for i in np.unique(ids[ids >= 0]):
        hue = np.array([(i * 97) % 200 + 40, (i * 57) % 200 + 40, (i * 151) % 200 + 40], dtype=np.uint8)
        rgb[ids == i] = 255 if i == cause else hue
    return rgb


def _bev(ax, scene) -> None:
    for r in scene.roads:
        road = Road(tuple(r["start"]), [tuple(p) for p in r["pieces"]], lanes=r["lanes"])
        s = np.linspace(0, road.length, 400)
        hw = road.half_width
        lines = [(hw + SHOULDER, "-"), (-hw - SHOULDER, "-"), (hw, "-"), (-hw, "-"), (0.0, "--")]
        lines += [(k * sign * LANE_WIDTH, ":") for k in range(1, r["lanes"]) for sign in (1, -1)]
        for d, style in lines:
            x, y, _ = road.pose(s, d)
            ax.plot(x, y, style, color="#c9a400" if d == 0 else "0.55", lw=0.8 if abs(d) > hw else 1.2)
    for x, y, yaw, length, width, color in scene.paint:
        corners = box_corners(np.array(x), np.array(y), np.array(yaw), length, width)
        ax.add_patch(Polygon(corners, closed=True, color="0.8"))
    for a in scene.agents:
        corners = box_corners(np.array(a["x"]), np.array(a["y"]), np.array(a["yaw"]), a["length"], a["width"])
        color = np.array(COLORS[a["kind"]]) / 255
        cause = a["id"] == scene.cause
        ax.add_patch(Polygon(corners, closed=True, facecolor=color, edgecolor="k" if cause else color,
                             lw=2.5 if cause else 0.5))
        track = scene.agent_poses[a["id"], 15:]
        ax.plot(track[:, 0], track[:, 1], ":", color=color, lw=0.8)
    ego = box_corners(np.array(0.0), np.array(0.0), np.array(0.0), EGO_LENGTH, EGO_WIDTH)
    ax.add_patch(Polygon(ego, closed=True, facecolor="none", edgecolor="k", lw=1.5))
    ax.plot(scene.history[:, 0], scene.history[:, 1], "o", color="0.3", ms=2.5, label="history (1.5 s)")
    ax.plot(scene.future[:, 0], scene.future[:, 1], "-", color="#1c7ed6", lw=2, label="expert future (6.4 s)")
    pts = np.concatenate([scene.history[:, :2], scene.future[:, :2]])
    if scene.cause is not None:                      # keep the cause in view
        cause = scene.agents[scene.cause]
        pts = np.concatenate([pts, [[cause["x"], cause["y"]]]])
    x0, x1 = min(pts[:, 0].min(), 0) - 12, max(pts[:, 0].max(), 40) + 15
    yc = (pts[:, 1].min() + pts[:, 1].max()) / 2
    half_y = max((x1 - x0) / 2 * 0.25, (pts[:, 1].max() - pts[:, 1].min()) / 2 + 8)
    ax.set_xlim(x0, x1)
    ax.set_ylim(yc - half_y, yc + half_y)
    ax.set_aspect("equal")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"bird's-eye view (ego frame at t)   family: {scene.family}   cause: {scene.cause_kind} "
                 f"({_cause_name(scene)})   decision: {scene.decision}   split: {scene.split}", fontsize=9)


def _cause_name(scene) -> str:
    if scene.cause is None:
        return "none"
    return f"{scene.agents[scene.cause]['kind']} #{scene.cause}"


def _coc(ax, scene, fontsize: float = 10.0) -> None:
    """The CoC word by word in a monospace flow: routine words blue, commitment words orange bold."""
    ax.axis("off")
    fig = ax.get_figure()
    char_w = 0.6 * fontsize / 72 * fig.dpi / ax.get_window_extent().width   # monospace advance, axes units
    width_chars = int(1.0 / char_w) - 1
    col, row = 0, 0
    for word, routine in zip(scene.coc.split(" "), scene.coc_routine):
        if col + len(word) > width_chars:
            col, row = 0, row + 1
        ax.text(col * char_w, 0.8 - row * 0.28, word, family="monospace", fontsize=fontsize, va="top",
                color=ROUTINE_RGB if routine else COMMIT_RGB, weight="normal" if routine else "bold",
                transform=ax.transAxes)
        col += len(word) + 1
    share = sum(scene.coc_routine) / len(scene.coc_routine)
    ax.text(0.0, 0.05, f"routine (from the history) {share:.0%}   commitment (needs the cameras) {1 - share:.0%}",
            fontsize=8, color="0.35", transform=ax.transAxes)


def draw_drive(drive, out_path, every: int = 1, progress: bool = True) -> int:
    """An animated GIF of a drive: per cycle the 4 cameras at t, the bird's-eye view and the CoC.
    Returns the number of frames written (one per `every` cycles, 10 / every frames a second)."""
    from PIL import Image
    from tqdm import tqdm

    if every < 1:
        raise ValueError(f"every={every!r} must be at least 1")
    cycles = drive.cycles[::every]
    if not cycles or cycles[0].images is None:
        raise ValueError("this drive has no images; generate it with rendering on")
    frames = []
    for scene in tqdm(cycles, desc="gif", unit="frame", disable=not progress):
        fig = plt.figure(figsize=(10, 6.2), dpi=72)
        grid = fig.add_gridspec(3, 4, height_ratios=[1, 2.2, 0.7], hspace=0.2, wspace=0.03,
                                left=0.03, right=0.98, top=0.9, bottom=0.02)
        for c, cam in enumerate(CAMERAS):
            ax = fig.add_subplot(grid[0, c])
            ax.imshow(scene.images[c, -1], interpolation="nearest")
            ax.set_title(cam.name, fontsize=8)
            ax.axis("off")
        _bev(fig.add_subplot(grid[1, :]), scene)
        _coc(fig.add_subplot(grid[2, :]), scene, fontsize=8.5)
        fig.suptitle(f"drive seed {drive.seed} ({drive.family}, {drive.split})   cycle {scene.cycle}   "
                     f"t = {scene.time:+.1f} s", fontsize=10, y=0.99)
        fig.canvas.draw()
        frames.append(Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).convert(
            "P", palette=Image.Palette.ADAPTIVE, colors=128))
        plt.close(fig)
    frames[0].save(out_path, save_all=True, append_images=frames[1:], duration=100 * every, loop=0,
                   optimize=True)
    return len(frames)
