"""Markdown tables of `specdrive roofline --json` results (docs/profile.md): one row per preset and
device, the snapshot cycle and the drive cycle with and without streaming prefill."""
from __future__ import annotations


def _label(r: dict) -> str:
    return f"{r['preset']}, {r['device_title']} ({r['workload']['precision']})"


def snapshot_table(results: list[dict]) -> str:
    """Stages of a snapshot cycle, plain and speculative (ms), and whether each fits the budget."""
    budget = {r["workload"]["budget_ms"] for r in results}
    lines = ["| preset, device (precision) | vision | prefill | plain: verify / reasoning "
             "| spec: draft step, verify(k+1) / reasoning | trajectory | cycle plain / spec "
             f"| fits {'/'.join(f'{b:g}' for b in sorted(budget))} ms |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        st, k = r["stages_ms"], r["workload"]["k"]
        p, s = r["plain"], r["speculative"]
        lines.append(f"| {_label(r)} | {st['vision']:.0f} | {st['prefill']:.0f} | {st['verify_1']:.1f} / "
                     f"{p['reasoning_ms']:.0f} | {st['draft_step']:.1f}, {st[f'verify_{k + 1}']:.1f} / "
                     f"{s['reasoning_ms']:.0f} | {st['trajectory']:.0f} | {p['cycle_ms']:.0f} / {s['cycle_ms']:.0f} "
                     f"| {'yes' if p['fits'] else 'no'} / {'yes' if s['fits'] else 'no'} |")
    return "\n".join(lines)


def drive_table(results: list[dict]) -> str:
    """On a drive (vision reuse, lookup), then with streaming prefill: prefill and spec cycle (ms)."""
    lines = ["| preset, device (precision) | prefill, snapshot | drive: vision / prefill / spec cycle "
             "| + streaming: prefill / spec cycle | cycle saved |", "|---|---|---|---|---|"]
    for r in results:
        d, ds = r["drive"], r["drive_streaming"]
        lines.append(f"| {_label(r)} | {r['stages_ms']['prefill']:.0f} | {d['stages_ms']['vision']:.0f} / "
                     f"{d['stages_ms']['prefill']:.0f} / {d['speculative']['cycle_ms']:.0f} | "
                     f"{ds['stages_ms']['prefill']:.0f} / {ds['speculative']['cycle_ms']:.0f} | "
                     f"{d['speculative']['cycle_ms'] - ds['speculative']['cycle_ms']:.0f} |")
    return "\n".join(lines)
