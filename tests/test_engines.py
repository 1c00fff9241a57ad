"""Engine profiles and `specdrive engines build` (issue 13): profiles are checked at configuration
time (FP8 on Orin refused with the reason, unknown names list the known ones), and a build
without TensorRT completes the steps before it, writes manifest.json (built: false) and exits 3.
The export step is the real one in test_onnx.py; here it is a small stand-in so the build's own
logic runs in a second."""
import dataclasses
import json
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from folders import layout_of
from engines import build as eb
from engines.profile import EngineProfile, GraphPrecision, known_profiles, load_profile
from core.artifacts import TensorSpec, read_manifest
from core.config import ConfigError, file_sha256
from core.graphs import required_graphs
from runtime.config import load_planner_config
from tools import cli

GRAPHS = required_graphs("none")      # a standalone draft: no draft_chain


def test_shipped_profiles_load():
    assert known_profiles() == ["hopper-fp8", "orin-fp16", "orin-int8", "thor-fp8"]
    for name in known_profiles():
        p = load_profile(name)
        assert p.name == name and p.shapes.verify_widths == (1, p.shapes.k_max + 1)
        eb.check_planner(p, load_planner_config(p.planner))   # shapes agree with the planner profile
    assert load_profile("orin-int8").quantized == ["prefill", "step", "step_tree"]     # trees at the step's precision
    assert load_profile("orin-fp16").quantized == []
    assert load_profile("thor-fp8").precision.graphs("fp8") == ["prefill", "step", "step_tree"]


def test_fp8_on_orin_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"(?s)fp8.*sm_87.*no FP8"):
        load_profile("orin-fp8")
    base = load_profile("orin-fp16")
    with pytest.raises(ConfigError, match="no FP8"):
        dataclasses.replace(base, precision=GraphPrecision(step="fp8"))
    assert load_profile("thor-bf16").precision.step == "bf16"   # DEVICE-PRECISION derives from the device


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"'orin-fp4' not found; known engine profiles: \['hopper-fp8'"):
        load_profile("orin-fp4")


def test_quantization_plan_options():
    base = load_profile("orin-int8")
    sq = dataclasses.replace(base, calibration=dataclasses.replace(base.calibration, smoothquant=True))
    assert eb.quantization_plan(sq) == {"prefill": "int8_sq", "step": "int8_sq", "step_tree": "int8_sq"}
    awq = dataclasses.replace(base, int4_awq=True, tensorrt_min="10.0")
    assert eb.quantization_plan(awq) == {"prefill": "int4_awq", "step": "int4_awq", "step_tree": "int4_awq"}
    assert base.calibration.method_for("int8") == "max" and base.calibration.method_for("fp8") is None


def test_profile_checks():
    base = load_profile("orin-int8")
    with pytest.raises(ConfigError, match="int4_awq needs TensorRT >= 10"):
        dataclasses.replace(base, int4_awq=True)
    assert dataclasses.replace(base, int4_awq=True, tensorrt_min="10.0").int4_awq
    with pytest.raises(ConfigError, match="precision.step='int3'"):
        GraphPrecision(step="int3")
    with pytest.raises(ConfigError, match="fp8 .* needs TensorRT >= 9"):
        dataclasses.replace(load_profile("hopper-fp8"), tensorrt_min="8.6")
    with pytest.raises(ConfigError, match="not a version"):
        dataclasses.replace(base, tensorrt_min="ten")
    with pytest.raises(ConfigError, match=r"disagree: shapes.max_len=1024 vs 512"):
        eb.check_planner(base, load_planner_config("cpu"))


def fake_export(checkpoint, out, draft, cfg, progress=print):
    """One small ONNX graph per name (ids (1, T) -> Identity) and a meta.json like the real one."""
    graphs = {}
    for name in GRAPHS:
        x = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"])
        y = helper.make_tensor_value_info("argmax", TensorProto.INT64, [1, "T"])
        g = helper.make_graph([helper.make_node("Identity", ["ids"], ["argmax"])], name, [x], [y])
        onnx.save(helper.make_model(g), out / f"{name}.onnx")
        graphs[name] = {"file": f"{name}.onnx", "sha256": file_sha256(out / f"{name}.onnx"),
                        "inputs": [{"name": "ids", "shape": [1, "T"], "dtype": "int64"}],
                        "outputs": [{"name": "argmax", "shape": [1, "T"], "dtype": "int64"}]}
    meta = {"kind": "engines", "backend": "onnxruntime", "max_len": cfg.max_len, "k_max": cfg.k_max,
            "graphs": graphs}
    (out / "meta.json").write_text(json.dumps(meta))
    return SimpleNamespace(graphs={n: SimpleNamespace(**g) for n, g in graphs.items()},   # what the build reads
                           target=SimpleNamespace(image_attention=layout_of(checkpoint)))


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setattr(eb, "export_onnx", fake_export)
    monkeypatch.setattr(eb, "find_tensorrt", lambda: (None, None))
    monkeypatch.setattr(eb, "write_trtllm", lambda *a, **k: {"status": "stubbed"})  # test_trtllm_checkpoint.py
    monkeypatch.setattr(eb, "calibrate", stand_in_calibrate)                        # test_calibration.py


def stand_in_calibrate(profile, out, meta, planner, progress):
    """The real step runs in test_calibration.py (on real graphs); this one says what it was asked
    (and leaves meta.json as the export wrote it)."""
    plan = eb.quantization_plan(profile)
    progress(f"[2/3] calibrate (stand-in): {plan}")
    return {"status": "done" if plan else "not needed", "graphs": plan}, meta


@pytest.mark.parametrize("name", ["orin-fp16", "orin-int8", "thor-fp8"])
def test_build_without_tensorrt_writes_the_manifest_and_exits_3(tmp_path, no_tensorrt, capsys, name):
    out = tmp_path / name
    shipped = ["--checkpoint", "checkpoints/tiny"] if load_profile(name).trtllm.enabled else []  # else the default
    assert cli.main(["engines", "build", "--profile", name, "--out", str(out), *shipped]) == eb.MISSING_TENSORRT == 3
    said = capsys.readouterr().out.splitlines()
    lines = [ln for ln in said if ln.startswith("[")]
    assert [ln[:5] for ln in lines] == ["[1/3]", "[2/3]", "[3/3]"], lines
    assert "TensorRT is not installed here" in lines[2] and f"PROFILE={name}" in lines[2]
    m = read_manifest(out)
    prof = load_profile(name)
    if prof.trtllm.enabled:     # the shipped target is frame_local: TensorRT-LLM's causal mask cannot run it
        assert m.steps["trtllm"].startswith("skipped") and any("trtllm: skipped" in ln for ln in said)
    assert m.built is False and m.profile == name and m.target_sm == prof.target_sm
    assert m.steps["export"] == "done" and m.steps["build"].startswith("needs TensorRT")
    assert m.needs["step"] == "build" and ("JetPack" in m.needs["install"] or "pip" in m.needs["install"])
    assert m.shapes.verify_widths == (1, 9) and m.precision == dict(prof.precision.items())
    for g, entry in m.graphs.items():
        assert file_sha256(out / entry.file) == entry.sha256, g
    assert m.onnx_meta_sha256 == file_sha256(out / "meta.json")
    assert m.tools["onnx"] and m.tools["tensorrt"] is None
    assert m.calibration == {"status": "not needed" if name == "orin-fp16" else "done",
                                "graphs": eb.quantization_plan(prof)}
    assert eb.quantization_plan(prof) == {"orin-fp16": {}, "orin-int8": {"prefill": "int8", "step": "int8", "step_tree": "int8"},
                                          "thor-fp8": {"prefill": "fp8", "step": "fp8", "step_tree": "fp8"}}[name]


def test_a_trtllm_profile_defaults_to_the_causal_twin_and_names_it_when_missing(tmp_path, monkeypatch, capsys):
    """thor-fp8 also writes TensorRT-LLM checkpoints (a causal mask of its own): without --checkpoint
    it takes checkpoints/tiny-causal; in a working directory without one, exit 2 naming it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(["engines", "build", "--profile", "thor-fp8", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "checkpoints/tiny-causal" in err and "make train-causal" in err, err
    assert not (tmp_path / "out").exists()


def test_refused_profiles_exit_2(tmp_path, no_tensorrt, capsys):
    for name, says in (("orin-fp8", "no FP8"), ("nope", "known engine profiles")):
        with pytest.raises(SystemExit) as e:
            cli.main(["engines", "build", "--profile", name, "--out", str(tmp_path / name)])
        assert e.value.code == 2 and says in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_tensorrt_optimization_profiles_and_trtexec_command():
    """The shapes handed to TensorRT (the builder itself is untested here: no TensorRT)."""
    p = load_profile("orin-int8")
    step = eb.dim_ranges(p, "step")
    assert [r["T"] for r in step] == [(1, 9, 9), (1, 448, 448)]
    assert [r["T"] for r in eb.dim_ranges(p, "prefill")] == [(1, 448, 448)]
    spec = SimpleNamespace(inputs=(TensorSpec("ids", (1, "T"), "int64"), TensorSpec("start", (1,), "int64")))
    cmd = eb._trtexec_command("trtexec", "step.onnx", "step.engine", spec, "int8", step[0])
    assert cmd[3:] == ["--minShapes=ids:1x1", "--optShapes=ids:1x9", "--maxShapes=ids:1x9", "--stronglyTyped"]
