"""Closed-loop drives: the metrics on hand-built drives whose answer is known, the loop's timing
(a late plan is followed late), the simulated latency (priced calls, deterministic), bad input."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench.common.modes import mode_config
from bench.drive.loop import MODES, closed_loop, in_force_step, mode_changes
from bench.drive.latency import parse_latency
from core.config import ConfigError
from runtime.config import load_planner_config
from scenes.agents import GREEN, RED, Agent, light_schedule, static
from bench.drive.ego_path import drive_metrics, hold_plan, line_violations
from scenes.config import DT, EGO_LENGTH, LANE_WIDTH, N_STEPS, T_START
from scenes.drive import history_at, simulate_scenario
from scenes.families import Scenario, ego_path, straight_road
from scenes.planner import StopRule

ROOT = Path(__file__).resolve().parent.parent
FIRST, LAST = 20, 100           # grid steps of the hand-built drives' closed-loop window
V = 15.0                        # m/s


def scenario(agents=(), stops=(), v=V) -> Scenario:
    road = straight_road()
    return Scenario("hand", [road], ego_path(road, -LANE_WIDTH / 2), v, v, list(agents), list(stops))


def straight_at(v: float) -> np.ndarray:
    """(N_STEPS, 3) ego poses at constant speed in the ego lane from x = 0 at T_START."""
    x = v * DT * np.arange(N_STEPS)
    return np.column_stack([x, np.full(N_STEPS, -LANE_WIDTH / 2), np.zeros(N_STEPS)])


def stopped_car(x: float) -> Agent:
    return static("car", x, -LANE_WIDTH / 2, 0.0, role="parked")


# --- metrics on hand-built drives ----------------------------------------------------------------
def test_a_straight_path_into_a_stopped_car_is_an_at_fault_collision_and_the_expert_avoids_it():
    scen = scenario([stopped_car(V * DT * 60)])
    through = drive_metrics(scen, straight_at(V), straight_at(V), FIRST, LAST)
    assert through["at_fault_collisions"] == 1 and through["collision_events"][0]["agent"] == 0
    assert through["min_ttc_s"] is not None and through["min_ttc_s"] < 0.2
    expert = simulate_scenario(scen).poses
    assert drive_metrics(scen, expert, expert, FIRST, LAST)["collisions"] == 0


def test_being_hit_from_behind_while_standing_is_not_at_fault():
    ego = np.column_stack([np.full(N_STEPS, 50.0), np.full(N_STEPS, -LANE_WIDTH / 2), np.zeros(N_STEPS)])
    chaser = Agent("car", straight_at(10.0))        # reaches x = 50 at step 50
    m = drive_metrics(scenario([chaser]), ego, ego, FIRST, LAST)
    assert m["collisions"] == 1 and m["at_fault_collisions"] == 0


def test_running_a_red_light_is_counted_and_a_green_one_is_not():
    x_line = V * DT * 60
    red = StopRule(x_line, "light", light=light_schedule([(-9.0, RED)]))
    scen = scenario(stops=[red])
    assert line_violations(straight_at(V), scen, FIRST, LAST)["red_light"] == 1
    expert = simulate_scenario(scen).poses           # stops at the line
    assert line_violations(expert, scen, FIRST, LAST)["red_light"] == 0
    green = scenario(stops=[StopRule(x_line, "light", light=light_schedule([(-9.0, GREEN)]))])
    assert line_violations(straight_at(V), green, FIRST, LAST)["red_light"] == 0


def test_a_stop_sign_passed_without_stopping_is_counted():
    scen = scenario(stops=[StopRule(V * DT * 40, "stop_sign", hold=1.0)])
    assert line_violations(straight_at(V), scen, FIRST, N_STEPS - 1)["stop_sign"] == 1
    expert = simulate_scenario(scen).poses           # stops, holds, goes
    assert line_violations(expert, scen, FIRST, N_STEPS - 1)["stop_sign"] == 0


def test_progress_is_measured_against_the_expert():
    scen = scenario()
    m = drive_metrics(scen, straight_at(V / 2), straight_at(V), FIRST, LAST)
    assert m["progress_ratio"] == pytest.approx(0.5, abs=0.01)


# --- the loop: a late plan is followed late -------------------------------------------------------
class BrakingDouble:
    """A scripted planner with a chosen latency: holds its speed until the stopped car is within
    TRIGGER m (read from the world pose the test's sense hands it), then plans a 6 m/s^2 stop."""
    TRIGGER, DECEL = 40.0, 6.0

    def __init__(self, car_x: float, latency_ms: float):
        self.car_x, self.latency_ms = car_x, latency_ms

    def plan(self, pose, history, scene=None):
        v = float(np.hypot(*(history[-1, :2] - history[-2, :2])) / DT)
        gap = self.car_x - 4.5 / 2 - (pose[0] + EGO_LENGTH / 2)
        t = DT * np.arange(1, 65)
        if gap > self.TRIGGER:
            traj = hold_plan(v)
        else:
            tt = np.minimum(t, v / self.DECEL)
            traj = np.column_stack([v * tt - self.DECEL * tt ** 2 / 2, np.zeros(64), np.zeros(64)])
        return SimpleNamespace(trajectory=traj, timing={"total_ms": self.latency_ms}, reasoning="", flags=[],
                               source="reasoning", reasoning_ids=[])


def world_sense(scen, ego, step):
    return ego[step], history_at(ego, step)


def test_a_late_plan_causes_a_collision_that_a_prompt_plan_avoids():
    car_x = V * DT * 70
    scen = scenario([stopped_car(car_x)])
    expert = straight_at(V)
    out = {}
    for latency in (50.0, 1500.0):
        ego, cycles = closed_loop(scen, expert, FIRST, LAST, BrakingDouble(car_x, latency), sense=world_sense)
        out[latency] = drive_metrics(scen, ego, expert, FIRST, LAST), cycles
    (prompt, fast), (late, slow) = out[50.0], out[1500.0]
    assert prompt["at_fault_collisions"] == 0 and late["at_fault_collisions"] == 1
    # the slow planner plans every 15 ticks, the prompt one every tick
    assert [c["start"] for c in slow[:3]] == [FIRST, FIRST + 15, FIRST + 30]
    assert [c["start"] for c in fast[:3]] == [FIRST, FIRST + 1, FIRST + 2]


def test_a_plan_takes_over_at_the_first_tick_after_its_latency():
    assert [in_force_step(10, ms) for ms in (0.0, 40.0, 100.0, 100.5, 250.0)] == [10, 11, 11, 12, 13]


# --- modes, latency specs -------------------------------------------------------------------------
def config_of(base, mode: str, budget_ms: float):
    """The cpu profile under one drive mode (its MODES row, the budget filled in)."""
    return mode_config(base, mode, mode_changes(mode, budget_ms))


def test_the_modes_table_makes_checked_configs():
    base = load_planner_config("cpu")
    for name in MODES:
        cfg = config_of(base, name, 250.0)
        assert (cfg.spec.k == 0) == name.startswith("plain")
        assert cfg.budget.enabled == name.endswith("+budget")
    with pytest.raises(ConfigError, match="modes"):
        mode_changes("turbo", 250.0)


@pytest.mark.parametrize("spec, named", [("nowhere:edge-2b", "orin-agx-64"), ("orin-agx-64:huge", "edge-2b"),
                                         ("orin-agx-64", "DEVICE:PRESET")])
def test_an_unknown_latency_spec_names_the_allowed_ones(spec, named):
    with pytest.raises(ConfigError, match=named):
        parse_latency(spec, load_planner_config("cpu"))


def test_budgets_are_one_for_all_latency_specs_or_one_each():
    from bench.drive.loop import parse_budgets

    assert parse_budgets("250", 2) == [250.0, 250.0] and parse_budgets("250,700", 2) == [250.0, 700.0]
    for bad in ("-1", "nan", "1,2,3", "fast"):
        with pytest.raises(ConfigError, match="--budget-ms"):
            parse_budgets(bad, 2)


def test_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    from scenes.dataset import DriveConfig, generate_drives
    from tools.cli import main

    with pytest.raises(SystemExit) as e:
        main(["drive", "--drives", "-3", "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "count 1..10000" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["drive", "--drives", "1", "--latency", "mars:edge-2b", "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "orin-agx-64" in capsys.readouterr().err
    generate_drives(DriveConfig(str(tmp_path / "d"), 1, 0.5, 3, "test"), progress=False)
    shard = next((tmp_path / "d").rglob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(SystemExit) as e:
        main(["drive", "--drives", str(tmp_path / "d"), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "differs from the manifest's field 'sha256.safetensors'" in capsys.readouterr().err


@pytest.mark.parametrize("arg, value, says", [
    ("--seconds", "0.05", "allowed 0.1..12 s (at least one 0.1 s cycle)"),
    ("--seconds", "0", "allowed 0.1..12 s"),
    ("--seconds", "nan", "allowed 0.1..12 s"),
    ("--seconds", "13", "allowed 0.1..12 s"),
    ("--seed", str(2 ** 32), "allowed 0..4294967295"),
    ("--drives", "10001", "count 1..10000"),
    ("--threads", "1000", "allowed 0..256"),
    ("--gifs", "-1", "allowed 0..10000"),
    ("--budget-ms", "1e9", "ms, 0..60000"),
    ("--latency", "measured,measured", "names measured more than once"),
    ("--expect-fingerprint", "0" * 64, "pinned by --expect-fingerprint"),
    ("--expect-fingerprint", "abc", "allowed 64 lowercase hex digits"),
    ("--expect-drives-fingerprint", "0" * 64, "pins a drives folder; --drives is a count"),
])
def test_every_number_of_drive_has_a_range_that_says_its_bounds(tmp_path, capsys, arg, value, says):
    from tools.cli import main

    with pytest.raises(SystemExit) as e:
        main(["drive", "--drives", "1", arg, value, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()            # refused before anything ran or was written


def test_a_drive_shorter_than_one_tick_is_refused_and_one_tick_is_one_cycle():
    from bench.drive.loop import drive_cases

    for seconds in (0.0, 0.05, 0.099):
        with pytest.raises(ConfigError, match=r"--seconds .* is out of range; allowed \[0.1, 12\]"):
            drive_cases(1, "test", seconds)
    for seconds, cycles in ((0.1, 1), (0.3, 3), (None, 80)):
        case = drive_cases(1, "test", seconds)[0]
        assert case.last - case.first + 1 == cycles, (seconds, case.first, case.last)
    with pytest.raises(ConfigError, match=r"seeds must stay in \[0, 2\*\*32 - 1\]"):
        drive_cases(2, "test", 0.1, seed=2 ** 32 - 1)


# --- the simulated latency on the shipped checkpoint ----------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    from bench.drive.command import open_backends
    from bench.drive.loop import drive_cases

    base = load_planner_config("cpu")
    tok, backends = open_backends(ROOT / "checkpoints" / "tiny", base, ["speculative"], 250.0)
    case = drive_cases(1, "test", 1.0, seed=5)[0]
    return base, tok, backends, case


def test_simulated_latency_is_the_sum_of_the_priced_calls_and_repeats_exactly(shipped):
    from bench.drive.loop import run_case
    from bench.drive.latency import PricedBackend
    from runtime.budget import FakeClock
    from runtime.planner import Planner

    base, tok, backends, case = shipped
    cfg = config_of(base, "speculative", 250.0)
    lat = parse_latency("orin-agx-64:edge-2b", base)
    runs = [run_case(case, "speculative", cfg, lat, backends, tok) for _ in range(2)]
    assert runs[0]["metrics"] == runs[1]["metrics"]
    assert runs[0]["cycle_log"] == runs[1]["cycle_log"] and runs[0]["cycles"] >= 1
    clock = FakeClock()
    priced = PricedBackend(backends["flat"], lat.pricer, clock, with_draft=True)
    from bench.drive.loop import render
    images, history = render(case.scenario, np.asarray(case.expert_world), case.first)
    res = Planner(priced, tok, cfg, clock=clock).plan(images, history)
    names = [n for n, _ in priced.calls]
    assert names[:2] == ["vision", "prefill"] and names[-1] == "action" and "draft" in names
    assert res.timing["total_ms"] == pytest.approx(sum(ms for _, ms in priced.calls), abs=1e-3)   # total_ms is rounded to 1 us
    # a longer verify costs more, and a plain backend's prefill has no draft to write
    assert lat.pricer.ms("verify", 9, 3000) > lat.pricer.ms("verify", 1, 3000)
    assert lat.pricer.ms("prefill", 1) > lat.pricer.ms("prefill", 0)


def test_the_budget_cuts_in_simulated_time(shipped):
    from bench.drive.loop import run_case

    base, tok, backends, case = shipped
    lat = parse_latency("orin-agx-64:edge-2b", base)
    cut = run_case(case, "speculative+budget", config_of(base, "speculative+budget", 600.0), lat, backends, tok)
    free = run_case(case, "speculative", config_of(base, "speculative", 600.0), lat, backends, tok)
    assert cut["budget_cuts"] >= 1 and max(c["latency_ms"] for c in cut["cycle_log"]) < \
        max(c["latency_ms"] for c in free["cycle_log"])
    assert free["budget_cuts"] == 0 and dataclasses.asdict(config_of(base, "speculative", 600.0).budget)["budget_ms"] == 0


def test_reuse_through_the_priced_backend_is_exact_and_prices_only_the_new_frames(shipped):
    """Along the expert's path (open loop, so both planners see the same frames) the reuse mode's
    reasoning equals the plain speculative mode's on every cycle, and once the t - 0.5 s frames
    were seen 5 cycles earlier, vision is priced for the 4 new frames of 8 only."""
    from bench.drive.loop import render
    from bench.drive.latency import PricedBackend
    from runtime.budget import FakeClock
    from runtime.planner import Planner

    base, tok, backends, case = shipped
    lat = parse_latency("orin-agx-64:edge-2b", base)
    runs = {}
    for mode in ("speculative", "speculative+reuse"):
        clock = FakeClock()
        priced = PricedBackend(backends["flat"], lat.pricer, clock, with_draft=True)
        planner = Planner(priced, tok, config_of(base, mode, 0.0), clock=clock)
        texts, vision = [], []
        for n in range(case.first, case.first + 7):
            images, history = render(case.scenario, np.asarray(case.expert_world), n)
            before = len(priced.calls)
            texts.append(planner.plan(images, history).reasoning_ids)
            vision.append(sum(ms for name, ms in priced.calls[before:] if name == "vision"))
        planner.fallback.close()
        runs[mode] = texts, vision
    assert runs["speculative"][0] == runs["speculative+reuse"][0]
    full, reused = runs["speculative"][1], runs["speculative+reuse"][1]
    assert reused[0] == pytest.approx(full[0])                       # nothing seen yet: all 8 frames
    assert reused[5] == pytest.approx(lat.pricer.ms("vision_frames", 4)) and reused[5] < 0.75 * full[5]


def test_streaming_through_the_priced_backend_is_exact_and_prices_only_the_new_blocks(frame_local_ckpt):
    """On a frame_local target, along the expert's path (open loop): the streaming mode's
    reasoning equals the reuse mode's on every cycle, and once half the frames are kept its
    priced prefill (new blocks + the rows after the images) is below the full prefill's."""
    from bench.drive.command import open_backends
    from bench.drive.latency import PricedBackend
    from bench.drive.loop import drive_cases, render
    from runtime.budget import FakeClock
    from runtime.planner import Planner

    base = load_planner_config("cpu")
    tok, backends = open_backends(frame_local_ckpt, base, ["speculative+stream"], 0.0)
    case = drive_cases(1, "test", 1.0, seed=5)[0]
    lat = parse_latency("orin-agx-64:edge-2b", base)
    runs = {}
    for mode in ("speculative+reuse", "speculative+stream"):
        clock = FakeClock()
        priced = PricedBackend(backends["flat"], lat.pricer, clock, with_draft=True)
        planner = Planner(priced, tok, config_of(base, mode, 0.0), clock=clock)
        texts, prefill = [], []
        for n in range(case.first, case.first + 7):
            images, history = render(case.scenario, np.asarray(case.expert_world), n)
            before = len(priced.calls)
            texts.append(planner.plan(images, history).reasoning_ids)
            prefill.append(sum(ms for name, ms in priced.calls[before:] if name == "prefill"))
        planner.fallback.close()
        runs[mode] = texts, prefill
    assert runs["speculative+reuse"][0] == runs["speculative+stream"][0]
    full, streamed = runs["speculative+reuse"][1], runs["speculative+stream"][1]
    assert streamed[5] == pytest.approx(lat.pricer.ms("image_blocks", 4) + lat.pricer.ms("prefill_streamed", 1, 4))
    assert streamed[5] < full[5], (streamed, full)


def test_plain_modes_alone_run_without_a_draft_backend(tmp_path, capsys):
    """Issue 50, 4: `drive --modes plain` opened only the plain backend and then read
    backends["flat"] (KeyError). Modes without a draft run on their own."""
    from tools.cli import main

    code = main(["drive", "--drives", "1", "--seconds", "0.1", "--modes", "plain,plain+budget", "--gifs", "0",
                 "--quiet", "--out", str(tmp_path / "o")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "o" / "measured" / "drives.json").read_text())
    assert list(result["modes"]) == ["plain", "plain+budget"] and len(result["records"]) == 2
