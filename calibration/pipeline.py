"""Calibration of an export folder in one call (what `make engines` runs between export and build):

    record the calibration set (train scenes, through the fp32 graphs)  -> FOLDER/calibration/
    quantize the planned graphs                                         -> FOLDER/quant/P/GRAPH.onnx
    the accuracy report (held-out scenes, the real loop)                -> FOLDER/report/
    meta.json switched to the quantized graphs                          (fp32 kept in "fp32_graphs")

After it, `specdrive plan --engines FOLDER --backend onnxruntime` runs the quantized graphs.
"""
from __future__ import annotations

from pathlib import Path

from calibration.record import record
from calibration.report import accuracy_report, write_report
from calibration.scenes import calibration_scenes
from calibration.variants import quantize_folder, select
from core.artifacts import EnginesMeta
from core.config import ConfigError


def calibrate_folder(folder: Path, meta: EnginesMeta, plan: dict, planner, prompts: int = 128, seed: int = 0,
                     method=None, report_scenes: int = 16, blame: bool = True, threads: int = 1,
                     progress=print) -> dict:
    """Every step above for {graph: precision}; -> what the manifest records."""
    from runtime.artifacts import load_tokenizer

    folder = Path(folder)
    if meta.fp32_graphs:
        raise ConfigError(f"{folder}/meta.json already points at quantized graphs; calibrate a fresh export")
    tok = load_tokenizer(folder)
    progress(f"recording the calibration set: {prompts} train scenes through the fp32 graphs")
    calib = record(folder, meta, tok, planner, calibration_scenes(prompts, seed), threads=threads)
    calib.save(folder / "calibration")
    entries = quantize_folder(folder, meta, calib, plan, method, progress)
    precisions = list(dict.fromkeys(plan.values()))
    progress(f"accuracy report: {', '.join(precisions)} against fp32 on {report_scenes} held-out scenes")
    report = accuracy_report(folder, meta, tok, planner, calib, precisions, scenes=report_scenes, blame=blame,
                             method=method, threads=threads, progress=progress)
    files = write_report(report, folder / "report")
    deployed = select(meta, entries)
    deployed.write(folder)
    return {"calibration_sha256": calib.sha256, "calibration_scenes": calib.scenes,
            "graphs": {g: e["precision"] for g, e in entries.items()},
            "files": {g: e["file"] for g, e in entries.items()},
            "report": [str(f.relative_to(folder)) for f in files], "verdicts": report["verdicts"]}
