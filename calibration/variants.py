"""Quantized graphs beside the fp32 ones in an export folder, and meta.json variants that pick them.

    FOLDER/GRAPH.onnx                       fp32, from `specdrive export onnx`
    FOLDER/calibration/                     the calibration set (calibration/record.py)
    FOLDER/quant/PRECISION/GRAPH.onnx       quantized from GRAPH.onnx with that set
    FOLDER/quant/index.json                 what each quantized file is: source hash, set hash, method

meta.json's "graphs" is what the ONNX Runtime backend runs; `select(meta, {graph: entry})`
returns a meta whose graphs are the chosen files (the fp32 ones elsewhere), each entry saying its
precision and, when quantized, the calibration set's hash. The fp32 entries are kept in
meta.json's "fp32_graphs" so a folder whose meta.json was switched to INT8 still knows its
reference (EnginesMeta.reference()).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from calibration.quantize import (PRECISIONS, QUANTIZER_VERSION, modelopt_version, quantize_graph,
                                  quantized_types)
from core.config import ConfigError, file_sha256
from core.graphs import ACTION_VELOCITY, DRAFT_GRAPHS, PREFILL, STEP, STEP_TREE, TARGET_LLM_GRAPHS, VISION
from core.artifacts import EnginesMeta, stamp_facts

TARGET, DRAFT = (*TARGET_LLM_GRAPHS, STEP_TREE), DRAFT_GRAPHS     # step_tree: the step over a token tree
GROUPS = {"target": TARGET, "draft": DRAFT, "vision": (VISION,), "action": (ACTION_VELOCITY,),
          "prefill": (PREFILL,), "step": (STEP, STEP_TREE)}
# action_output (the last Euler step's integration and the combine of the draws) is a handful of
# adds: never quantized
QUANTIZABLE = (*TARGET, *DRAFT, VISION, ACTION_VELOCITY)
INDEX = "index.json"


def graphs_of(meta: EnginesMeta, groups) -> list[str]:
    """Graph names of the groups (GROUPS keys or graph names) that this export has."""
    have = meta.reference().graphs
    out = []
    for g in groups:
        if g not in GROUPS and g not in QUANTIZABLE:
            raise ConfigError(f"graph group {g!r}: one of {sorted(GROUPS)} or a graph of {list(QUANTIZABLE)}")
        out += [n for n in GROUPS.get(g, (g,)) if n in have and n not in out]
    return out


def quantize_folder(folder: Path, meta: EnginesMeta, calib, plan: dict, method=None, progress=print) -> dict:
    """Quantized files for {graph: precision} (reused when source, set and method are unchanged);
    -> {graph: meta entry of the quantized file}. `method`: a calibration method, None (each
    precision's default) or a function precision -> method."""
    folder = Path(folder)
    index_file = folder / "quant" / INDEX
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    src_graphs = meta.reference().graphs
    out = {}
    for graph, precision in plan.items():
        if precision == "fp32":
            continue
        if precision not in PRECISIONS:
            raise ConfigError(f"precision {precision!r} for {graph}: one of fp32, {', '.join(PRECISIONS)}")
        if graph not in QUANTIZABLE or graph not in src_graphs:
            raise ConfigError(f"graph {graph!r} cannot be quantized here: one of "
                              f"{[g for g in QUANTIZABLE if g in src_graphs]}")
        src = src_graphs[graph]
        how = method(precision) if callable(method) else method
        rel = f"quant/{precision}/{graph}.onnx"
        key = f"{precision}/{graph}"
        want = {"source_sha256": src.sha256, "calibration_sha256": calib.sha256, "asked": how,
                "quantizer": [QUANTIZER_VERSION, modelopt_version()]}
        dst = folder / rel
        done = index.get(key)
        if done and all(done.get(k) == v for k, v in want.items()) and dst.is_file() \
                and file_sha256(dst) == done["sha256"]:
            info = done
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            info = quantize_graph(folder / src.file, dst, calib.samples(graph), precision, how)
            import onnx
            info.update(want, sha256=file_sha256(dst), holds=quantized_types(onnx.load(str(dst))),
                        seconds=round(time.perf_counter() - t0, 1))
            index[key] = info
            index_file.parent.mkdir(parents=True, exist_ok=True)
            index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            progress(f"  quantized {graph} -> {precision} ({info['method']}, {info['samples']} samples, "
                     f"{info['dequantize_nodes']} DequantizeLinear) in {info['seconds']} s")
        out[graph] = {**src.to_dict(), "file": rel, "sha256": info["sha256"], "precision": precision,
                      "quantization": {k: info[k] for k in ("method", "samples", "calibration_sha256",
                                                            "source_sha256", "holds", "excluded",
                                                            "quantizer") if k in info}}
    return out


def select(meta: EnginesMeta, entries: dict) -> EnginesMeta:
    """A copy of meta whose graphs are `entries` ({graph: meta.json entry}) where given, fp32
    elsewhere; its facts stamped as written."""
    base = {g: {**e.to_dict(), "precision": e.precision} for g, e in meta.reference().graphs.items()}
    graphs = {g: copy.deepcopy(entries.get(g, e)) for g, e in base.items()}
    sets = {e["quantization"]["calibration_sha256"] for e in graphs.values() if "quantization" in e}
    written = {**meta.to_dict(), "fp32_graphs": copy.deepcopy(base), "graphs": graphs,
               "precision": {g: e["precision"] for g, e in graphs.items()},
               "calibration_sha256": sets.pop() if len(sets) == 1 else sorted(sets) or None}
    return EnginesMeta.from_dict(stamp_facts(written), meta.folder)
