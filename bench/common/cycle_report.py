"""What `specdrive plan` leaves behind: one JSON line per cycle, a live table, bird's-eye SVGs.

Pictures are SVG written with the standard library (no plotting library needed):
ego frame, x forward drawn upwards, the predicted trajectory, the expert's (when known), the
ego history, and the reasoning text underneath.
"""
from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

TABLE_HEADER = (f"{'cycle':>5} {'source':>13} {'tau':>5} {'k':>4} {'vision':>7} {'prefill':>7} "
                f"{'reason':>7} {'traj':>7} {'slack':>7}  reasoning / flags")


def table_row(res, width: int = 60) -> str:
    """One line of the live table: source, tau, mean k, per-stage ms, budget slack, reasoning."""
    st = res.timing.get("stages_ms", {})
    ks = res.decode.get("ks") or [0]
    slack = res.timing.get("slack_ms")
    text = res.reasoning if not res.flags else f"[{','.join(res.flags)}] {res.error or res.reasoning}"
    cells = [f"{res.cycle:>5}", f"{res.source:>13}", f"{res.decode.get('tau', 0):>5.2f}",
             f"{np.mean(ks):>4.1f}"]
    cells += [f"{st.get(s, 0.0):>7.1f}" for s in ("vision", "prefill", "reasoning", "trajectory")]
    cells.append(f"{'-' if slack is None else f'{slack:.1f}':>7}")
    return " ".join(cells) + "  " + text[:width]


class JsonLog:
    """Appends one JSON object per line and flushes it, so a crash loses nothing written."""

    def __init__(self, path: Path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        """Strict JSON (RFC 8259): a NaN or inf would raise here, never reach the file."""
        self.f.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _polyline(points: np.ndarray, to_px, color: str, width: float, dash: str = "") -> str:
    pts = " ".join(f"{u:.1f},{v:.1f}" for u, v in (to_px(x, y) for x, y in points[:, :2]))
    dash = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"{dash}/>'


def birdseye_svg(path: Path, res, history=None, expert=None, size: int = 360) -> None:
    """Bird's-eye picture of one cycle (ego at the bottom centre, x up, y left)."""
    tracks = [t for t in (res.trajectory, expert, history) if t is not None]
    reach = max([20.0] + [float(np.abs(np.asarray(t)[:, :2]).max()) * 1.1 for t in tracks])
    scale = (size * 0.8) / reach

    def to_px(x, y):
        return size / 2 - y * scale, size * 0.9 - x * scale

    parts = [f'<rect width="{size}" height="{size + 90}" fill="white"/>',
             f'<circle cx="{size / 2}" cy="{size * 0.9}" r="4" fill="black"/>']
    if history is not None:
        parts.append(_polyline(np.asarray(history), to_px, "#888", 2, "3,3"))
    if expert is not None:
        parts.append(_polyline(np.asarray(expert), to_px, "#2a7", 2.5))
    if res.trajectory is not None:
        color = {"reasoning": "#c22", "prefill": "#e80", "stop": "#55c"}.get(res.source, "#000")
        parts.append(_polyline(res.trajectory, to_px, color, 2.5))
    lines = [f"cycle {res.cycle} {res.scene or ''} source={res.source} flags={','.join(res.flags) or '-'}",
             *_wrap(res.error or res.reasoning or "(no reasoning)", 60)[:4]]
    for i, line in enumerate(lines):
        parts.append(f'<text x="6" y="{size + 16 + 16 * i}" font-family="monospace" '
                     f'font-size="11">{escape(line)}</text>')
    legend = "red: predicted  orange: prefill fallback  blue: stop  green: expert  grey: history"
    parts.append(f'<text x="6" y="14" font-family="monospace" font-size="10">{legend}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size + 90}">'
           + "".join(parts) + "</svg>\n")
    Path(path).write_text(svg, encoding="utf-8")


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    return lines + [line]
