"""specdrive profile's report (stage table, Chrome trace, per-call costs) and the pictures."""
import json
from pathlib import Path

import pytest

from runtime.trace import Range
from bench.profile import report as profile_report, timeline


def ranges():
    ms = 1_000_000
    return [Range("vision", 1, 1 * ms, 3 * ms), Range("draft", 1, 4 * ms, 5 * ms),
            Range("verify", 1, 5 * ms, 7 * ms), Range("verify", 1, 7 * ms, 8 * ms),
            Range("reasoning", 1, 4 * ms, 8 * ms), Range("cycle", 1, 0, 10 * ms)]


CYCLE = {"cycle": 1, "prompt_len": 10, "flags": ["budget_cut"], "reasoning": "ego is cruising , covering 4 m , so",
         "reasoning_ids": [5, 6, 7, 8], "routine_tokens": 3,
         "decode": {"ks": [2, 0], "ns": [2, 0], "emitted": 4},
         "timing": {"total_ms": 10.0, "budget_ms": 9.0, "stages_ms": {"reasoning": 4.0, "vision": 2.0}}}


def test_stage_table_counts_and_shares():
    rows = {r["stage"]: r for r in profile_report.stage_table(ranges())}
    assert rows["verify"]["count"] == 2 and rows["verify"]["mean_ms"] == pytest.approx(1.5)
    assert rows["reasoning"]["share"] == pytest.approx(0.4) and rows["cycle"]["share"] == 1.0
    assert list(rows)[0] == "cycle"
    assert "| verify | 2 |" in profile_report.format_table(list(rows.values()))


def test_chrome_trace_is_complete_events_in_microseconds():
    t = profile_report.chrome_trace(ranges(), {1: "MainThread"})
    json.dumps(t)
    x = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert len(x) == 6 and x[0]["ts"] == 1000.0 and x[0]["dur"] == 2000.0


def test_call_costs_match_verify_widths_and_draft_steps():
    c = profile_report.call_costs(ranges(), [CYCLE])
    assert c["verify"] == {"1": 1.0, "3": 2.0} and c["draft_step"] == pytest.approx(0.5)
    assert c["vision"] == 2.0 and c["action"] is None


def test_segments_and_step_classes():
    assert timeline.segments(CYCLE) == [("vision", 0.0, 2.0), ("reasoning", 2.0, 4.0)]
    assert timeline.step_classes(CYCLE) == [(2, "routine")]


def test_pictures_are_drawn(tmp_path):
    out = timeline.draw_all([CYCLE, {**CYCLE, "cycle": 2, "flags": []}], tmp_path)
    for name in ("timeline.png", "stages.png", "accepted.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert out["accepted_mean"] == {"routine": 2.0}


def test_profile_cycles_carry_their_routine_token_counts(tmp_path):
    """accepted.png splits accepted lengths by routine / commitment from each cycle's routine_tokens;
    without them every step counted as commitment."""
    from bench.common.accept_map import routine_tokens
    from bench.profile.command import ProfileRun, profile_here
    from runtime.artifacts import ModelSource, load_tokenizer

    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "tiny"
    profile_here(ProfileRun(source=ModelSource(checkpoint=shipped), out=tmp_path, cycles=2, warmup=0, no_nsys=True))
    recs = [json.loads(line) for line in (tmp_path / "cycles.jsonl").read_text().splitlines()]
    tok = load_tokenizer(shipped)
    assert len(recs) == 2
    assert [r["routine_tokens"] for r in recs] == [routine_tokens(tok, r["reasoning"]) for r in recs]
    assert any(cls == "routine" for r in recs for _, cls in timeline.step_classes(r)), "no step counted as routine"
