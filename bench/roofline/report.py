"""Markdown tables of `specdrive roofline --json` results (docs/profile.md): one row per preset and
device, the snapshot cycle and the drive cycle with and without streaming prefill."""
from __future__ import annotations


def _table(head: list[str], results: list[dict], cells) -> str:
    """A row per result: its preset, device and precision, then `cells(result)`."""
    lines = ["| preset, device (precision) | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    lines += [f"| {r['preset']}, {r['device_title']} ({r['workload']['precision']}) | " + " | ".join(cells(r)) + " |"
              for r in results]
    return "\n".join(lines)


def _yes(x: bool) -> str:
    return "yes" if x else "no"


def snapshot_table(results: list[dict]) -> str:
    """Stages of a snapshot cycle, plain and speculative (ms), and whether each fits the budget."""
    budgets = "/".join(f"{b:g}" for b in sorted({r["workload"]["budget_ms"] for r in results}))

    def cells(r):
        st, k, p, s = r["stages_ms"], r["workload"]["k"], r["plain"], r["speculative"]
        return [f"{st['vision']:.0f}", f"{st['prefill']:.0f}", f"{st['verify_1']:.1f} / {p['reasoning_ms']:.0f}",
                f"{st['draft_step']:.1f}, {st[f'verify_{k + 1}']:.1f} / {s['reasoning_ms']:.0f}",
                f"{st['trajectory']:.0f}", f"{p['cycle_ms']:.0f} / {s['cycle_ms']:.0f}",
                f"{_yes(p['fits'])} / {_yes(s['fits'])}"]
    return _table(["vision", "prefill", "plain: verify / reasoning", "spec: draft step, verify(k+1) / reasoning",
                   "trajectory", "cycle plain / spec", f"fits {budgets} ms"], results, cells)


def drive_table(results: list[dict]) -> str:
    """On a drive (vision reuse, lookup), then with streaming prefill: prefill and spec cycle (ms)."""
    def cells(r):
        d, ds = r["drive"], r["drive_streaming"]
        return [f"{r['stages_ms']['prefill']:.0f}",
                f"{d['stages_ms']['vision']:.0f} / {d['stages_ms']['prefill']:.0f} / {d['speculative']['cycle_ms']:.0f}",
                f"{ds['stages_ms']['prefill']:.0f} / {ds['speculative']['cycle_ms']:.0f}",
                f"{d['speculative']['cycle_ms'] - ds['speculative']['cycle_ms']:.0f}"]
    return _table(["prefill, snapshot", "drive: vision / prefill / spec cycle", "+ streaming: prefill / spec cycle",
                   "cycle saved"], results, cells)
