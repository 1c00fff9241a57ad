"""Calibration (issue 13): the calibration set is train-only and keyed by the graphs' input names,
every quantized graph has explicit zero points, the quantized folder runs through the unchanged
loop (speculative == plain decoding of the same INT8 graphs), SmoothQuant keeps the function,
FP8 / INT4-AWQ graphs hold their types, the accuracy report and `make engines`' calibrate step."""
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from calibration import quantize as cq
from calibration.pipeline import calibrate_folder
from calibration.record import CACHE_INPUTS, load
from calibration.scenes import calibration_scenes
from engines import build as eb
from core.config import ConfigError, file_sha256
from core.artifacts import read_manifest, read_meta
from runtime.artifacts import ModelSource, open_backend
from runtime.config import PlannerConfig, SpecConfig, load_planner_config
from runtime.planner import Planner
from scenes.world import make_scene
from tools import cli

PLAN = {"prefill": "int8", "step": "int8", "step_tree": "int8"}     # orin-int8's: trees at the step's precision


@pytest.fixture(scope="module")
def calibrated(tiny_onnx, tmp_path_factory):
    """A copy of the export, calibrated as `make engines PROFILE=orin-int8` does (small numbers)."""
    folder = tmp_path_factory.mktemp("calib") / "int8"
    shutil.copytree(tiny_onnx, folder)
    fp32 = read_meta(folder)
    lines = []
    done = calibrate_folder(folder, fp32, PLAN, load_planner_config("cpu"), prompts=6, report_scenes=3,
                            progress=lines.append)
    return folder, fp32, done, lines


def session(path, model=None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString() if model is not None else str(path), opts,
                                providers=["CPUExecutionProvider"])


def test_calibration_scenes_are_train_only():
    for split in ("test", "heldout", "unseen"):
        with pytest.raises(ConfigError, match="never uses"):
            calibration_scenes(2, split=split)
    a, b = calibration_scenes(3, seed=0), calibration_scenes(3, seed=1)
    assert [s.name for s in a] == ["train-0-0", "train-0-1", "train-0-2"]
    assert not np.array_equal(a[0].images, b[0].images)          # another seed, other scenes
    test = make_scene(0, split="test")                           # bench / report scenes are others
    assert not any(np.array_equal(s.images, test.images) for s in a)


def test_the_set_is_keyed_by_input_names_and_hashed(calibrated):
    folder, fp32, done, _ = calibrated
    calib = load(folder / "calibration")
    assert calib.sha256 == done["calibration_sha256"] and len(calib.scenes) == 6
    for graph, entry in fp32.graphs.items():
        names = [i.name for i in entry.inputs]
        samples = calib.samples(graph)
        assert samples, graph
        for s in samples:
            assert sorted(s) == sorted(names), graph
            for spec in entry.inputs:           # fixed axes as exported (caches padded back to max_len)
                fixed = [(d, n) for d, n in zip(spec.shape, s[spec.name].shape) if isinstance(d, int)]
                assert all(d == n for d, n in fixed), (graph, spec, s[spec.name].shape)
    widths = {s["ids"].shape[1] for s in calib.graphs["step"]}
    assert 9 in widths, widths                   # k_max + 1: every other scene runs k = k_max
    assert all(s["cache"].shape[-2] < calib.max_len for s in calib.graphs["step"])   # stored trimmed
    meta = read_meta(folder)
    for g in PLAN:
        assert meta.graphs[g].quantization["calibration_sha256"] == calib.sha256
    assert meta.calibration_sha256 == calib.sha256


def test_a_changed_calibration_file_is_refused(calibrated, tmp_path):
    folder = calibrated[0]
    shutil.copytree(folder / "calibration", tmp_path / "c")
    f = tmp_path / "c" / "step.safetensors"
    b = bytearray(f.read_bytes())
    b[-1] ^= 1
    f.write_bytes(bytes(b))
    with pytest.raises(ConfigError, match="changed since it was recorded"):
        load(tmp_path / "c")
    with pytest.raises(ConfigError, match="not a calibration set"):
        load(tmp_path)


def test_meta_switches_to_the_quantized_graphs_and_keeps_fp32(calibrated):
    folder, fp32, done, _ = calibrated
    meta = read_meta(folder)
    for g, e in meta.graphs.items():
        assert file_sha256(folder / e.file) == e.sha256, g
        if g in PLAN:
            assert e.file == f"quant/int8/{g}.onnx" and e.precision == "int8"
            assert e.quantization["source_sha256"] == fp32.graphs[g].sha256
            assert e.quantization["holds"] == {"INT8": e.quantization["holds"]["INT8"]}
        else:
            assert e.to_dict() == {**fp32.graphs[g].to_dict(), "precision": "fp32"}
    assert {g: e.to_dict() for g, e in meta.fp32_graphs.items()} == \
        {g: {**e.to_dict(), "precision": "fp32"} for g, e in fp32.graphs.items()}
    with pytest.raises(ConfigError, match="already points at quantized graphs"):
        calibrate_folder(folder, meta, PLAN, load_planner_config("cpu"), prompts=1)


def test_quantized_files_are_reused_until_the_quantizer_changes(calibrated, monkeypatch, tmp_path):
    from calibration import variants
    fp32, folder = calibrated[1], tmp_path / "copy"
    shutil.copytree(calibrated[0], folder)
    calib, said = load(folder / "calibration"), []
    first = variants.quantize_folder(folder, fp32, calib, {"step": "int8"}, progress=said.append)
    assert said == [] and first["step"]["file"] == "quant/int8/step.onnx"       # made by the fixture
    monkeypatch.setattr(variants, "QUANTIZER_VERSION", variants.QUANTIZER_VERSION + 1)
    variants.quantize_folder(folder, fp32, calib, {"step": "int8"}, progress=said.append)
    assert len(said) == 1 and said[0].strip().startswith("quantized step -> int8")


def test_every_dequantize_has_an_explicit_zero_point(calibrated):
    folder = calibrated[0]
    for f in sorted((folder / "quant").rglob("*.onnx")):
        m = onnx.load(str(f))
        dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
        assert dq, f
        cq.check_zero_points(m)


def test_explicit_zero_points_are_added_where_missing():
    """A DequantizeLinear without a zero point gets zeros of its input's type; same numbers."""
    w = numpy_helper.from_array(np.array([[-3, 7], [100, -128]], np.int8), "w")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq"),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w, scale])
    m = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 19)])   # IR 10: onnxruntime 1.23 (the last for Python 3.10) reads up to 11
    x = {"x": np.array([[1.0, -2.0]], np.float32)}
    before = session(None, m).run(None, x)[0]
    with pytest.raises(ConfigError, match="without a zero point"):
        cq.check_zero_points(m)
    assert cq.explicit_zero_points(m) == 1
    cq.check_zero_points(m)
    zp = next(t for t in m.graph.initializer if t.name == m.graph.node[0].input[2])
    assert zp.data_type == TensorProto.INT8 and list(zp.dims) == []
    assert np.array_equal(session(None, m).run(None, x)[0], before)
    assert np.allclose(before, [[-101.5, 131.5]], atol=0.1)    # 0.5 * x @ w (ORT may quantize x on the fly)


def test_a_dequantize_onnx_runtime_cannot_run_names_its_matmul():
    """ModelOpt's INT4 blocks came out with scales of the wrong shape on a transposed Gemm; such a
    node is found by running the graph once, and the MatMul/Gemm it feeds is named."""
    w = numpy_helper.from_array(np.ones((4, 2), np.int8), "w")
    bad_scale = numpy_helper.from_array(np.ones((1, 2), np.float32), "s")      # blocks of 2 need (2, 2)
    zp = numpy_helper.from_array(np.zeros((1, 2), np.int8), "zp")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["wf"], name="dq", axis=0, block_size=2),
             helper.make_node("Transpose", ["wf"], ["wt"], perm=[1, 0]),
             helper.make_node("Transpose", ["wt"], ["wf2"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wf2"], ["y"], name="the_linear")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w, bad_scale, zp])
    m = helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    x = {"x": np.ones((1, 4), np.float32)}
    assert cq.failing_matmul(m, x) == "the_linear"
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((2, 2), np.float32), "s"))
    m.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.zeros((2, 2), np.int8), "zp"))
    assert cq.failing_matmul(m, x) is None


def test_int4_on_the_all_gemm_vision_tower_is_refused_not_faked(calibrated, tmp_path):
    folder, fp32, _, _ = calibrated
    samples = load(folder / "calibration").samples("vision")[:2]
    with pytest.raises(cq.NothingToQuantize, match="nothing in it can be quantized to int4_awq"):
        cq.quantize_graph(folder / fp32.graphs["vision"].file, tmp_path / "v.onnx", samples, "int4_awq")
    assert not (tmp_path / "v.onnx").exists()


def ort_planner(folder, k, adaptive=False, tree=""):
    be, tok = open_backend(ModelSource(engines=folder, threads=1), 512)
    return Planner(be, tok, PlannerConfig(fallback="on_failure", euler_steps=2, trajectory_samples=8, max_len=512,
                                          spec=SpecConfig(k=k, adaptive=adaptive, tree=tree)))


def test_int8_graphs_speculative_equals_plain(calibrated):
    """The loop on the INT8 graphs: speculative greedy output == plain decoding of the same graphs,
    token trees too (step_tree is calibrated with step, so the backend takes trees)."""
    folder = calibrated[0]
    plain = ort_planner(folder, 0)
    spec = [ort_planner(folder, 4), ort_planner(folder, 8), ort_planner(folder, 4, adaptive=True),
            ort_planner(folder, 8, tree="8,6,3")]
    assert plain.backend.meta.graphs["step"].precision == plain.backend.meta.graphs["step_tree"].precision == "int8"
    assert spec[-1].backend.takes_trees
    for i in range(6):
        s = make_scene(200 + i, split="test")
        ref = plain.plan(s.images, s.history)
        assert ref.reasoning_ids and ref.trajectory is not None
        for p in spec:
            r = p.plan(s.images, s.history)
            assert r.reasoning_ids == ref.reasoning_ids, (i, p.cfg.spec)
            assert np.array_equal(r.trajectory, ref.trajectory), (i, p.cfg.spec)
            assert r.decode["trees"] > 0 or not p.cfg.spec.tree, i


def test_int8_step_is_quantized_yet_close(calibrated):
    folder, fp32, _, _ = calibrated
    calib = load(folder / "calibration")
    s32, s8 = session(folder / fp32.graphs["step"].file), session(folder / "quant/int8/step.onnx")
    agree, diff = [], 0.0
    for x in calib.samples("step"):
        a, b = s32.run(None, x), s8.run(None, x)
        agree.append(np.mean(a[1] == b[1]))
        diff = max(diff, float(np.abs(a[3] - b[3]).max()))            # new K/V rows
    print(f"argmax agreement {np.mean(agree):.3f}, max K/V diff {diff:.3f}")
    assert np.mean(agree) >= 0.9 and diff > 0.0


def test_smoothquant_keeps_the_function(calibrated):
    """Smoothing alone (no Q/DQ) moves scales between activations and weights: same outputs."""
    folder, fp32, _, _ = calibrated
    samples = load(folder / "calibration").samples("step")[:3]
    m = onnx.load(str(folder / fp32.graphs["step"].file))
    n = cq.smooth_graph(m, samples)
    assert n == len([x for x in m.graph.node if x.op_type == "MatMul" and x.input[0].endswith("_smoothed")]) > 0
    s0, s1 = session(folder / fp32.graphs["step"].file), session(None, m)
    for x in samples:
        for a, b in zip(s0.run(None, x), s1.run(None, x)):
            if a.dtype.kind == "f":
                fin = np.isfinite(a)
                assert np.allclose(a[fin], b[fin], rtol=1e-3, atol=1e-3)
            else:
                assert np.array_equal(a, b)


@pytest.mark.parametrize("precision,holds", [("fp8", "FLOAT8E4M3FN"), ("int4_awq", "INT4"), ("int8_sq", "INT8")])
def test_other_precisions_hold_their_types(calibrated, tmp_path, precision, holds):
    folder, fp32, _, _ = calibrated
    samples = load(folder / "calibration").samples("step")
    dst = tmp_path / "step.onnx"
    info = cq.quantize_graph(folder / fp32.graphs["step"].file, dst, samples, precision)
    m = onnx.load(str(dst))
    cq.check_zero_points(m)
    assert set(cq.quantized_types(m)) == {holds}, cq.quantized_types(m)
    assert info["dequantize_nodes"] > 0 and (precision != "int4_awq" or info["zero_points_added"] > 0)
    s32, sq = session(folder / fp32.graphs["step"].file), session(dst)
    agree = [np.mean(s32.run(None, x)[1] == sq.run(None, x)[1]) for x in samples]
    print(precision, info, f"argmax agreement {np.mean(agree):.3f}")
    assert np.mean(agree) >= 0.8


def test_unknown_precision_and_method_are_refused(calibrated, tmp_path):
    folder, fp32, _, _ = calibrated
    src = folder / fp32.graphs["step"].file
    with pytest.raises(ConfigError, match="calibration makes"):
        cq.quantize_graph(src, tmp_path / "x.onnx", [{}], "int2")
    with pytest.raises(ConfigError, match="one of \\['max'\\]"):
        cq.quantize_graph(src, tmp_path / "x.onnx", [{}], "fp8", "entropy")


def test_the_accuracy_report(calibrated):
    folder, _, done, lines = calibrated
    report = json.loads((folder / "report" / "report.json").read_text())
    names = list(report["variants"])
    assert names[:3] == ["fp32", "int8", "int8 +draft"]
    assert {f"int8 only {g}" for g in ("prefill", "step", "draft", "vision", "action")} <= set(names)
    assert report["split"] == "heldout" and report["scenes"] == 3
    for name, v in report["variants"].items():
        assert v["scenes"] == 3 and v["errors"] == 0 and np.isfinite(v["tau"]) and v["tau"] >= 1.0, name
        assert 0.0 <= v["cause_acc"] <= 1.0 and v["ade"] > 0, name
        if name != "fp32":
            assert 0.0 <= v["differs_from_fp32"] <= 1.0 and isinstance(v["tau_ok"], bool), name
    assert report["variants"]["int8 only draft"]["trajectory_diff_max_m"] == 0.0    # the draft never moves it
    assert report["verdicts"] == done["verdicts"] and report["verdicts"][0].startswith("int8 (target graphs)")
    md = (folder / "report" / "report.md").read_text()
    assert "| int8 +draft |" in md and "## Verdicts" in md
    assert (folder / "report" / "report.png").stat().st_size > 5000
    assert any(ln.strip().startswith("quantized step -> int8") for ln in lines)


def test_engines_build_calibrates(tiny_onnx, tmp_path, monkeypatch, capsys):
    """`specdrive engines build` with an int8 profile: the calibrate step runs for real (on a copy of
    the session's export, for the cpu planner profile), the manifest records it, exit 3 here."""
    def export(checkpoint, out, draft, cfg, progress=print):
        shutil.copytree(tiny_onnx, out, dirs_exist_ok=True)
        return read_meta(out)
    monkeypatch.setattr(eb, "export_onnx", export)
    monkeypatch.setattr(eb, "find_tensorrt", lambda: (None, None))
    prof = tmp_path / "tiny-int8.yaml"
    prof.write_text("device: test\ntarget_sm: 87\ntensorrt_min: '8.6'\ntensorrt_below: '11'\nplanner: cpu\n"
                    "precision: {prefill: int8, step: int8, step_tree: int8}\n"
                    "shapes: {max_prompt: 300, max_len: 512, k_max: 8}\n"
                    "calibration: {prompts: 4, report_scenes: 2}\n")
    out = tmp_path / "out"
    assert cli.main(["engines", "build", "--profile", str(prof), "--out", str(out)]) == 3
    text = capsys.readouterr().out
    assert "[2/3] calibrate: prefill int8, step int8, step_tree int8 from 4 train scenes" in text
    m = read_manifest(out)
    assert m.calibration["status"] == "done" and m.steps["calibrate"] == "done"
    assert m.calibration["graphs"] == PLAN
    assert m.graphs["step"].file == "quant/int8/step.onnx"
    assert m.onnx_meta_sha256 == file_sha256(out / "meta.json")
    assert (out / "report" / "report.md").is_file()


def test_calibrate_cli_errors(tiny_onnx, tmp_path, capsys):
    for argv, says in ((["report", "--engines", str(tiny_onnx)], "no calibration set"),
                       (["report", "--engines", str(tiny_onnx), "--precisions", "int3"], "a comma list of"),
                       (["record", "--engines", str(tiny_onnx), "--profile", "orin"], "exported for max_len 512"),
                       (["record", "--engines", str(tmp_path)], "no meta.json")):
        with pytest.raises(SystemExit) as e:
            cli.main(["calibrate", *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err, argv


def test_cache_inputs_are_the_kv_graphs(calibrated):
    folder, fp32, _, _ = calibrated
    with_cache = {g for g, e in fp32.graphs.items() if any(i.name in CACHE_INPUTS for i in e.inputs)}
    assert with_cache == {"step", "step_tree", "draft_feed", "draft_chain"} & set(fp32.graphs)
    assert Path(folder / "calibration" / "index.json").is_file()


# --- issue 23.8: a tampered calibration set is refused, never a traceback ---------------------------

def small_set(folder):
    from calibration.record import CalibrationSet
    calib = CalibrationSet({"step": [{"ids": np.arange(3)[None]}, {"ids": np.arange(4)[None]}],
                            "vision": [{"patches": np.ones((2, 3), np.float32)}]}, ["train-0-0", "train-0-1"], 64)
    return calib.save(folder)


def rehash(index):
    from calibration.record import digest
    index["sha256"] = digest(index["graphs"], index["scenes"], index["max_len"])


def _not_safetensors(c, index):
    (c / "step.safetensors").write_bytes(b"these bytes are no safetensors file")
    index["graphs"]["step"]["sha256"] = file_sha256(c / "step.safetensors")
    rehash(index)


TAMPER = {   # name -> (change(folder, index) -> None, or text replacing index.json), words
    "invalid JSON": ("{not json", "is not valid JSON"),
    "a list index": ("[1, 2]", "expected a 'specdrive-calibration' table"),
    "no graphs": (lambda c, i: (i.pop("graphs"), i.update(sha256="x")), "'graphs' must map"),
    "samples 1": (lambda c, i: i["graphs"]["step"].update(samples=1), "its sha256 does not match"),
    "samples 1, rehashed": (lambda c, i: (i["graphs"]["step"].update(samples=1), rehash(i)),
                            "is not sample NNNN.input of 1 samples"),
    "samples -1, rehashed": (lambda c, i: (i["graphs"]["step"].update(samples=-1), rehash(i)), "-1 samples"),
    "max_len": (lambda c, i: i.update(max_len=4096), "its sha256 does not match"),
    "scenes": (lambda c, i: i["scenes"].append("test-0-0"), "its sha256 does not match"),
    "not safetensors": (_not_safetensors, "not a safetensors file"),
    "file outside": (lambda c, i: (i["graphs"]["step"].update(file="../step.safetensors"), rehash(i)),
                     "outside the set"),
}


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_a_tampered_calibration_set_is_refused(tmp_path, how):
    c = tmp_path / "calibration"
    index = small_set(c)
    assert load(c).graphs["step"][1]["ids"].shape == (1, 4)            # the intact set loads
    shutil.copy(c / "step.safetensors", tmp_path / "step.safetensors")  # for "file outside"
    change, word = TAMPER[how]
    if isinstance(change, str):
        (c / "index.json").write_text(change)
    else:
        change(c, index)
        (c / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=word.replace("(", r"\(")):
        load(c)


def test_calibrate_report_on_a_tampered_set_exits_2(tiny_onnx, tmp_path, capsys):
    e = tmp_path / "e"
    shutil.copytree(tiny_onnx, e)
    small_set(e / "calibration")
    (e / "calibration" / "index.json").write_text("[]")
    with pytest.raises(SystemExit) as done:
        cli.main(["calibrate", "report", "--engines", str(e), "--scenes", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and "calibration-" not in err[0] and "index.json" in err[0], err


def test_the_one_image_vision_graph_is_calibrated_on_the_cycle_graphs_own_frames():
    from calibration.record import frame_samples

    patches = np.arange(8 * 6 * 3, dtype=np.float32).reshape(8 * 6, 3)     # 8 images of 6 patches
    got = frame_samples([{"patches": patches}], 8)
    assert len(got) == 8 and all(g["patches"].shape == (6, 3) for g in got)
    assert np.array_equal(np.concatenate([g["patches"] for g in got]), patches)
    with pytest.raises(ConfigError, match="do not split"):
        frame_samples([{"patches": patches[:-1]}], 8)
