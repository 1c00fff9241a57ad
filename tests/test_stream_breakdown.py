"""`specdrive bench --stream-breakdown` on the tiny frame_local checkpoint, two cycles of one drive:
each cycle's stages add up to its time, the decode steps' draft and verify calls reach the
planner's observer and fit in the stages that run them, and the streaming planner streams."""
import pytest

from bench.bench.stream_breakdown import PLANNERS, SKIP, breakdown
from runtime.artifacts import ModelSource
from runtime.config import load_planner_config
from tools import bench

CYCLES = 2


@pytest.fixture(scope="module")
def planners(frame_local_ckpt):
    base = load_planner_config("cpu")
    return breakdown(ModelSource(checkpoint=str(frame_local_ckpt)), base, seed=11, cycles=CYCLES, skip=0, threads=1)


def test_each_cycles_stages_add_up_to_its_time(planners):
    assert list(planners) == list(PLANNERS)
    for name, got in planners.items():
        assert len(got["cycles"]) == CYCLES
        for row in got["cycles"]:
            stages = {k: v for k, v in row.items() if k in ("prompt", "vision", "prefill", "reasoning", "trajectory",
                                                             "fallback", "fallback_wait", "expert_wait")}
            assert {"prompt", "vision", "prefill", "reasoning", "trajectory"} <= set(stages), f"{name}: {row}"
            assert abs(sum(stages.values()) + row["unaccounted"] - row["total"]) < 0.05, f"{name}: {row}"
            assert all(0.0 <= v <= row["total"] + 0.01 for v in stages.values()), f"{name}: {row}"
        assert got["ms_p50"]["total"] > 0 and "prefill" in got["ms_p50"]


def test_the_observer_sees_the_decode_calls_inside_their_stages(planners):
    for name, got in planners.items():
        for row in got["cycles"]:
            assert row["steps"] >= 1, f"{name}: the observer saw no decode step"
            assert row["verify_calls"] > 0.0, f"{name}: {row}"
            calls = row["draft_calls"] + row["verify_calls"]
            assert calls <= row["reasoning"] + row["trajectory"] + 0.05, f"{name}: {row}"


def test_only_the_streaming_planner_streams(planners):
    assert all(row["blocks"] is None for row in planners["full"]["cycles"])
    assert all(set(row["blocks"]) >= {"reused", "computed"} for row in planners["stream"]["cycles"])


def test_too_few_cycles_are_refused_naming_the_option(frame_local_ckpt, tmp_path, capsys):
    argv = ["--checkpoint", str(frame_local_ckpt), "--stream-breakdown", "--cycles", str(SKIP),
            "--json", str(tmp_path / "b.json")]
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and "--cycles" in capsys.readouterr().err
