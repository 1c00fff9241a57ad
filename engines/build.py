"""`specdrive engines build`: export -> calibrate -> build for one engine profile, into one folder.

    out/            the ONNX graphs + meta.json of `specdrive export onnx` (an onnxruntime folder:
                    `specdrive plan --engines out --backend onnxruntime` runs it)
    out/trt/        GRAPH.engine per graph, where TensorRT is present
    out/manifest.json   hashes, tool versions, SM, platform, shapes, precisions, built: true|false

Where neither the `tensorrt` Python package nor `trtexec` is found (as on the development and CI
machines) every step before the build completes, the manifest says `built: false`, which step
needs TensorRT and how to install it on the device, and `build` returns MISSING_TENSORRT (3).
Engines are built on the device they run on.
"""
from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import time
from pathlib import Path

from engines.profile import EngineProfile
from engines.trtllm import write_trtllm
from export.onnx import ExportConfig, export_onnx
from core.artifacts import META, EngineFile, EnginesMeta, Graph, Manifest, TensorSpec, read_engines_meta
from core.config import ConfigError, file_sha256, to_dict
from core.graphs import DRAFT_PREFILL, IMAGE_BLOCKS, PREFILL, STEP_TREE, TARGET_LLM_GRAPHS

BUILT, MISSING_TENSORRT = 0, 3
INSTALL_TENSORRT = {
    "orin": "JetPack 6.1+: `sudo apt install nvidia-tensorrt python3-libnvinfer` (TensorRT 10.3; "
            "trtexec in /usr/src/tensorrt/bin); DRIVE OS 6: TensorRT 8.6 comes with the DRIVE OS SDK",
    "thor": "JetPack 7: `sudo apt install nvidia-tensorrt python3-libnvinfer` (TensorRT 10.13)",
    "other": "`pip install tensorrt` (TensorRT 10.x wheels for CUDA 12) or NVIDIA's TensorRT container",
}


def build(profile: EngineProfile, checkpoint: Path, out: Path, planner, progress=print) -> int:
    """Every step of the profile into `out`; -> BUILT or MISSING_TENSORRT (the manifest says why)."""
    check_planner(profile, planner)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = export_onnx(checkpoint, out, None, export_config(profile, planner), progress=lambda *_: None)
    progress(f"[1/3] export: {len(meta.graphs)} ONNX graphs -> {out} ({time.perf_counter() - t0:.0f} s)")
    calibrated, meta = calibrate(profile, out, meta, planner, progress)
    trt, trtexec = find_tensorrt()
    steps = {"export": "done", "calibrate": calibrated["status"]}
    trtllm, layout = None, meta.target.image_attention
    if profile.trtllm.enabled and layout != "causal":
        steps["trtllm"] = (f"skipped: the target's image layout is {layout!r} and TensorRT-LLM "
                           "builds its own causal mask; these TensorRT engines run it (a causal target gets both)")
        progress(f"trtllm: {steps['trtllm']}")
    elif profile.trtllm.enabled:
        trtllm = write_trtllm(profile, checkpoint, out / "trtllm", planner, progress)
        steps["trtllm"] = trtllm["status"]
    if trt is None and trtexec is None:
        steps["build"] = "needs TensorRT (not found here)"
        install = INSTALL_TENSORRT[device_family(profile)]
        progress(f"[3/3] build: TensorRT is not installed here (neither the `tensorrt` Python package "
                 f"nor trtexec); engines are built on the device. Install it there: {install}; then "
                 f"rerun `make engines PROFILE={profile.name}`. Manifest: {out / 'manifest.json'}")
        write_manifest(profile, checkpoint, out, meta, steps, calibrated, built=False, install=install, trtllm=trtllm)
        return MISSING_TENSORRT
    engines = build_engines(profile, out, meta, trt, trtexec, progress)  # untested here: no TensorRT
    steps["build"] = "done"
    write_manifest(profile, checkpoint, out, meta, steps, calibrated, built=True, engines=engines, trtllm=trtllm)
    return BUILT


def export_config(profile: EngineProfile, planner) -> ExportConfig:
    s = profile.shapes
    return ExportConfig(max_len=s.max_len, k_max=s.k_max, samples=planner.trajectory_samples,
                        combine=planner.trajectory_combine, cameras=s.cameras, frames=s.frames,
                        image_hw=tuple(s.image_hw))


def check_planner(profile: EngineProfile, planner) -> None:
    """The engine shapes and the planner profile they serve must agree (one number, two readers)."""
    s = profile.shapes
    pairs = {"max_len": (s.max_len, planner.max_len), "k_max": (s.k_max, planner.spec.k_max),
             "cameras": (s.cameras, len(planner.cameras)), "frames": (s.frames, planner.frames),
             "image_hw": (list(s.image_hw), list(planner.image_hw))}
    bad = {k: v for k, v in pairs.items() if v[0] != v[1]}
    if bad:
        raise ConfigError(f"engine profile {profile.name!r} and planner profile {profile.planner!r} disagree: "
                          + "; ".join(f"shapes.{k}={a} vs {b}" for k, (a, b) in bad.items()))


def calibrate(profile: EngineProfile, out: Path, meta: EnginesMeta, planner, progress) -> tuple[dict, EnginesMeta]:
    """The profile's int8 / fp8 / int4 graphs from a calibration set of train scenes, the accuracy
    report against fp32 (out/report/), and out/meta.json switched to the quantized graphs (the fp32
    ones stay, listed in its "fp32_graphs") -> (what the manifest records, the meta.json now)."""
    plan = quantization_plan(profile)
    if not plan:
        progress("[2/3] calibrate: nothing to calibrate (no int8/fp8/int4 graphs in this profile)")
        return {"status": "not needed", "graphs": {}}, meta
    from calibration.pipeline import calibrate_folder

    c = profile.calibration
    t0 = time.perf_counter()
    done = calibrate_folder(out, meta, plan, planner, prompts=c.prompts, seed=c.seed, method=c.method_for,
                            report_scenes=c.report_scenes, progress=lambda m: progress(f"      {m}"))
    progress(f"[2/3] calibrate: {', '.join(f'{g} {p}' for g, p in plan.items())} from "
             f"{c.prompts} train scenes (set {done['calibration_sha256'][:12]}); accuracy report "
             f"{out / 'report' / 'report.md'} ({time.perf_counter() - t0:.0f} s)")
    for line in done["verdicts"]:
        progress(f"      {line}")
    return {"status": "done", **done}, read_engines_meta(out)


def quantization_plan(profile: EngineProfile) -> dict:
    """{graph: calibration precision}: int8 (int8_sq with calibration.smoothquant), fp8, and the
    target's graphs as int4_awq (weight-only) where the profile asks for INT4-AWQ weights."""
    plan = {}
    for g, p in profile.precision.items():
        if p == "int8":
            plan[g] = "int8_sq" if profile.calibration.smoothquant else "int8"
        elif p == "fp8":
            plan[g] = "fp8"
    if profile.int4_awq:        # step_tree with step: trees verify at the step's precision
        plan.update({g: "int4_awq" for g in (*TARGET_LLM_GRAPHS, STEP_TREE)})
    return plan


def find_tensorrt():
    """(the tensorrt module or None, the trtexec path or None)."""
    try:
        import tensorrt as trt
    except ImportError:
        trt = None
    return trt, shutil.which("trtexec") or (
        "/usr/src/tensorrt/bin/trtexec" if Path("/usr/src/tensorrt/bin/trtexec").is_file() else None)


def device_family(profile: EngineProfile) -> str:
    return "orin" if profile.target_sm == 87 else "thor" if profile.target_sm in (101, 110) else "other"


def write_manifest(profile, checkpoint, out: Path, meta: EnginesMeta, steps: dict, calibrated: dict, built: bool,
                   install: str = "", engines: dict | None = None, trtllm: dict | None = None) -> dict:
    """OUT/manifest.json of this build (engines {graph: EngineFile} where built) -> its JSON."""
    s = profile.shapes
    card = Manifest.new(
        out, profile=profile.name, built=built, steps=steps, device=profile.device, target_sm=profile.target_sm,
        platform=profile.platform, tensorrt_range=[profile.tensorrt_min, profile.tensorrt_below],
        planner=profile.planner, checkpoint=str(checkpoint),
        shapes={**to_dict(s), "verify_widths": list(s.verify_widths)},
        precision=dict(profile.precision.items()), int4_awq=profile.int4_awq, calibration=calibrated,
        graphs=meta.graphs, onnx_meta_sha256=file_sha256(out / META), tools=tool_versions(),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), install=install, engines=engines, trtllm=trtllm)
    card.write(out)
    return card.to_dict()


def tool_versions() -> dict:
    found = {"python": platform.python_version()}
    for dist in ("torch", "onnx", "onnxruntime", "onnxruntime-gpu", "nvidia-modelopt", "tensorrt"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


# --- TensorRT (UNTESTED: written against TensorRT's documented Python builder API and trtexec's
# --- options; no TensorRT or GPU exists on the development and CI machines) --------------------

def dim_ranges(profile: EngineProfile, graph: str) -> list[dict]:
    """Optimization profiles for the graph's named dynamic axes: {axis: (min, opt, max)} each.
    prefill: prompt rows; step graphs: verify widths 1..k_max+1, then prompt-sized feeds;
    step_tree: one profile per tree width w, covering the widths above the one before, tuned at w
    (the runtime pads a tree's pass to w, so every pass runs at a profile's opt, a CUDA graph each)."""
    s = profile.shapes
    rows = (1, s.max_prompt, s.max_prompt)
    verify = (1, s.k_max + 1, s.k_max + 1)
    images = s.cameras * s.frames
    other = {"B": (1, 8, 64), "R": (1, s.max_prompt, s.max_len), "n": (1, images, images)}
    if graph in (PREFILL, DRAFT_PREFILL, IMAGE_BLOCKS):
        return [{"T": rows, **other}]
    if graph == STEP_TREE:
        lows = (1, *(w + 1 for w in s.tree_widths[:-1]))
        return [{"T": (lo, w, w), **other} for lo, w in zip(lows, s.tree_widths)]
    return [{"T": verify, **other}, {"T": rows, **other}]


def _shape(spec: TensorSpec, axes: dict, which: int) -> tuple:
    return tuple(axes[d][which] if isinstance(d, str) else d for d in spec.shape)


def build_engines(profile: EngineProfile, out: Path, meta: EnginesMeta, trt, trtexec, progress) -> dict:
    """UNTESTED here. One engine per graph -> {graph: EngineFile}."""
    (out / "trt").mkdir(exist_ok=True)
    engines = {}
    for graph, g in meta.graphs.items():
        t0 = time.perf_counter()
        dst = out / "trt" / f"{graph}.engine"
        prec = getattr(profile.precision, graph)
        if trt is not None:
            dst.write_bytes(_build_python(trt, out / g.file, g, prec, dim_ranges(profile, graph)))
            version = trt.__version__
        else:
            subprocess.run(_trtexec_command(trtexec, out / g.file, dst, g, prec,
                                            dim_ranges(profile, graph)[0]), check=True)
            version = "trtexec"
        engines[graph] = EngineFile(f"trt/{dst.name}", file_sha256(dst), version)
        progress(f"[3/3] build: {graph} ({prec}) -> {dst} ({time.perf_counter() - t0:.0f} s)")
    return engines


def _build_python(trt, onnx_file: Path, g: Graph, prec: str, ranges: list[dict]) -> bytes:
    """UNTESTED. Strongly typed on TensorRT >= 10 for Q/DQ graphs (the Q/DQ nodes fix the types),
    precision flags on 8.6 (explicit batch is the default from 10 on and must be asked for before)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    typed = major >= 10 and prec in ("int8", "fp8")
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if typed else 0
    if major < 10:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_file)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"{onnx_file}: TensorRT's ONNX parser failed: {errors}")
    config = builder.create_builder_config()
    if not typed:
        for flag in {"fp16": ["FP16"], "bf16": ["BF16"], "int8": ["INT8", "FP16"]}.get(prec, []):
            config.set_flag(getattr(trt.BuilderFlag, flag))
    for axes in ranges:
        opt = builder.create_optimization_profile()
        for spec in g.inputs:
            if any(isinstance(d, str) for d in spec.shape):
                opt.set_shape(spec.name, *(_shape(spec, axes, i) for i in range(3)))
        config.add_optimization_profile(opt)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError(f"{onnx_file}: TensorRT could not build an engine (see its log above)")
    return bytes(engine)


def _trtexec_command(trtexec: str, onnx_file: Path, dst: Path, g: Graph, prec: str, axes: dict) -> list[str]:
    """UNTESTED. trtexec takes one optimization profile per shape triple: the first range."""
    dyn = [s for s in g.inputs if any(isinstance(d, str) for d in s.shape)]
    cmd = [trtexec, f"--onnx={onnx_file}", f"--saveEngine={dst}"]
    for flag, i in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
        if dyn:
            cmd.append(flag + "=" + ",".join(f"{s.name}:" + "x".join(map(str, _shape(s, axes, i))) for s in dyn))
    cmd += {"fp16": ["--fp16"], "bf16": ["--bf16"], "int8": ["--stronglyTyped"], "fp8": ["--stronglyTyped"]}.get(prec, [])
    return cmd
