"""runtime.trace: free when off, the same ranges from the loop, planner and budget when on, and
`import runtime` never loads nvtx."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prompt.vocab import Tokenizer
from runtime import trace
from table_backend import TableBackend
from runtime.config import PlannerConfig
from runtime.planner import Planner

ROOT = Path(__file__).resolve().parents[1]
TOK = Tokenizer.build("ego is cruising at 12 m/s , so keep speed the lead brakes slow down".split())
T = np.arange(-15, 1) * 0.1
HISTORY = np.stack([8 * T, 0 * T, 0 * T], 1)
IMAGES = np.random.default_rng(0).integers(0, 256, (4, 2, 64, 96, 3), dtype=np.uint8)


@pytest.fixture(autouse=True)
def off():
    yield
    trace.disable()


def test_off_is_one_shared_null_context():
    assert not trace.enabled()
    assert trace.span("verify") is trace.span("draft")
    assert trace.begin("cycle") is None
    trace.end(None)


def test_recorder_keeps_nested_ranges_in_order():
    rec = trace.Recorder()
    trace.enable(rec)
    tok = trace.begin("cycle")
    with trace.span("reasoning"):
        with trace.span("verify"):
            pass
    trace.end(tok)
    assert [r.name for r in rec.ranges] == ["verify", "reasoning", "cycle"]
    v, r, c = rec.ranges
    assert c.start_ns <= r.start_ns <= v.start_ns <= v.end_ns <= r.end_ns <= c.end_ns
    assert all(x.ms >= 0 for x in rec.ranges) and rec.threads


def test_a_planner_cycle_opens_every_stage_and_engine_call():
    be = TableBackend(len(TOK), max_len=1024, draft_noise=0.3, stop_id=TOK.cot_end, stop_slope=0.3)
    planner = Planner(be, TOK, PlannerConfig(fallback="inline"))
    rec = trace.Recorder()
    trace.enable(rec)
    res = planner.plan(IMAGES, HISTORY)
    trace.disable()
    names = [r.name for r in rec.ranges]
    assert res.ok
    for name in ("cycle", "vision", "prefill", "fallback", "reasoning", "draft", "verify", "accept",
                 "trajectory", "action", "checks"):
        assert name in names, name
    assert names.count("cycle") == 1 and names.count("verify") == res.decode["steps"]
    assert names.count("draft") == sum(1 for k in res.decode["ks"] if k)
    assert len(res.decode["ns"]) == res.decode["steps"]


def test_nvtx_is_optional_and_import_runtime_stays_lean():
    code = ("import runtime, runtime.trace, runtime.planner, runtime.loop, runtime.budget, sys, json; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('nvtx', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    if not trace.nvtx_available():
        with pytest.raises(ImportError):
            trace.enable(nvtx=True)
        assert not trace.enabled() or trace.disable() is None
