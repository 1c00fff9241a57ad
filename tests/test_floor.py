"""The measured floor (tools.measure_c --floor, bench/roofline/floor.py) on this CPU at the tiny
preset with small sizes, and `specdrive roofline --measured` reading it."""
import dataclasses
import json

import pytest

from bench.common.devices import load_devices
from bench.common.costs import Shapes
from bench.roofline.projection import project
from bench.roofline.measured import VerifyCurve, calibrated, efficiencies
from models.config import load_preset
from tools import cli, measure_c

SMALL = ["--preset", "tiny", "--max-len", "128", "--cached", "40", "--widths", "1,3,9", "--images", "1",
         "--samples", "1", "--runs", "2", "--warmup", "0", "--copy-mb", "4", "--threads", "1"]


@pytest.fixture(scope="module")
def floors(tmp_path_factory):
    out = {}
    for path in ("inference", "reference"):
        f = tmp_path_factory.mktemp("floor") / f"{path}.json"
        assert measure_c.main(["--floor", *SMALL, "--path", path, "--json", str(f)]) == 0
        out[path] = f
    return out


def test_floor_record(floors):
    rec = json.loads(floors["inference"].read_text())
    assert rec["preset"] == "tiny" and rec["device"] == "cpu" and rec["graphs"] is False
    assert sorted(rec["calls"]["target"], key=int) == ["1", "3", "9"]
    cfg = load_preset("tiny")
    s = Shapes(cfg, "fp32", "engine")
    for w, row in rec["calls"]["target"].items():
        w = int(w)
        assert row["bytes"] == s.target(w, 40 + w, 128, w).bytes
        assert row["ms"] > 0 and row["share"] == pytest.approx(row["gbps"] / rec["copy_gbps"])
        assert row["gbps"] == pytest.approx(row["bytes"] / row["ms"] / 1e6)
    for kind in ("draft_feed", "draft_chain", "vision", "prefill", "expert"):
        assert rec["calls"][kind]["ms"] > 0 and rec["calls"][kind]["bytes"] > 0
    assert rec["calls"]["prefill"]["rows"] <= 128


def test_inference_path_launches_fewer_ops(floors):
    """The inference path's fused products, norms and rotary: fewer ops per step than the reference."""
    fast, ref = (json.loads(floors[p].read_text())["kernels"] for p in ("inference", "reference"))
    assert fast["target_1"] < 0.6 * ref["target_1"]
    assert fast["draft_chain"] < ref["draft_chain"]


def test_roofline_measured(floors, tmp_path, capsys):
    out = tmp_path / "roof.json"
    assert cli.main(["roofline", "--preset", "tiny", "--device", "h200", "--measured", str(floors["inference"]),
                     "--trees", "16,8,4", "--tree-tau", "3.5", "--json", str(out)]) == 0
    assert "measured / predicted" in capsys.readouterr().out
    res, floor = json.loads(out.read_text()), json.loads(floors["inference"].read_text())
    m = res["measured"]
    assert [r["call"] for r in m["calls"]] == ["target width 1", "target width 3", "target width 9", "draft_feed",
                                                "draft_chain", "vision", "prefill", "expert"]
    devs = load_devices().devices
    cfg, h200 = load_preset("tiny"), devs["h200"]
    row = m["calls"][0]
    assert row["predicted_ms"] == pytest.approx(Shapes(cfg, "fp32", "engine").target(1, 41, 128, 1).ms(h200, "fp32"))
    assert row["measured_ms"] == floor["calls"]["target"]["1"]["ms"]
    eff = efficiencies(h200, floor, "fp32")
    step = floor["calls"]["target"]["1"]
    assert eff["memory_efficiency"] == pytest.approx(max(step["bytes"] / step["ms"] / 1e6 / 4800.0, 1e-3))
    w = res["workload"]
    orin = next(o for o in m["projections"] if o["device"] == "orin-agx-64")
    from bench.common.costs import Workload
    ow = Workload(**{**w, "precision": "int8", "image_hw": tuple(w["image_hw"])})
    assert orin["measured_eff_ms"] == pytest.approx(project(cfg, calibrated(devs["orin-agx-64"], eff), ow)
                                                    ["speculative"]["cycle_ms"])
    t = res["token_trees"]
    curve = VerifyCurve(floor)
    assert t["priced_from"] == str(floors["inference"])
    assert all(ms == pytest.approx(curve(int(wd))) for wd, ms in t["verify_ms"].items())


def test_verify_curve_is_linear_between_measured_widths():
    floor = {"calls": {"target": {"1": {"ms": 2.0}, "9": {"ms": 4.0}, "17": {"ms": 8.0}}}}
    c = VerifyCurve(floor)
    assert [c(1), c(5), c(9), c(13), c(25)] == [2.0, 3.0, 4.0, 6.0, 12.0]


def test_bad_measured_files_exit_2(floors, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline", "--preset", "edge-2b", "--device", "h200", "--measured", str(floors["inference"])])
    assert e.value.code == 2 and "measured preset 'tiny'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"calls": {}}))
    with pytest.raises(SystemExit) as e:
        cli.main(["roofline", "--preset", "tiny", "--device", "h200", "--measured", str(bad)])
    assert e.value.code == 2 and "not a floor record" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        measure_c.main(["--floor", "--preset", "tiny", "--max-len", "64", "--cached", "60", "--widths", "9"])
    assert e.value.code == 2 and "widths [9]: each in 1..max_len - cached = 4" in capsys.readouterr().err


def test_bf16_precision_prices_like_fp16():
    cfg, dev = load_preset("edge-2b"), load_devices().devices["h200"]
    a, b = (Shapes(cfg, p, "engine").target(1, 1200, 2048, 1) for p in ("bf16", "fp16"))
    assert a.ms(dev, "bf16") == b.ms(dev, "fp16")
    assert dataclasses.replace(dev).peak_flops("bf16") == dev.peak_flops("fp16")
