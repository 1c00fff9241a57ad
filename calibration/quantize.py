"""Post-training quantization of one ONNX graph with NVIDIA ModelOpt, from a recorded calibration set.

    quantize_graph(src, dst, samples, "int8")         INT8 Q/DQ, per-tensor activation scales
    quantize_graph(src, dst, samples, "int8_sq")      SmoothQuant first (smooth_graph), then INT8 Q/DQ
    quantize_graph(src, dst, samples, "fp8")          FP8 (E4M3) Q/DQ
    quantize_graph(src, dst, samples, "int4_awq")     INT4 weight-only, AWQ (clip search), blocks of 128

Only MatMul inputs are quantized (the linear layers and the attention products): the residual
adds, norms and activations stay in the graph's own precision (fp32 here; TensorRT runs them in
FP16 where the profile says so). Every DequantizeLinear leaves with an explicit zero point (zeros of
the quantized type, the shape of its scale): ONNX Runtime can mis-optimize a DequantizeLinear
without one into wrong numbers, and TensorRT requires zero points of 0 anyway.

ModelOpt's ONNX path runs on the CPU here (modelopt.onnx.quantization.quantize, ONNX Runtime as the
calibrator). Its INT4 AWQ concatenates activations of all samples along the batch axis, so it is
given the samples of one shape (the most common prompt / verify width).

SmoothQuant (Xiao et al., 2022) is done here on the ONNX graph, not through ModelOpt's torch path:
for each MatMul with a constant weight W (in, out) the per-input-channel activation maximum a_j is
measured on the calibration set, s_j = a_j^alpha / max|W_j,:|^(1 - alpha), W becomes diag(s) W and
a Mul by 1/s goes in front of the MatMul (TensorRT fuses it into the previous op). The product is
unchanged in exact arithmetic; the activation outliers move into the weights, which INT8 handles
per output channel. One graph pipeline serves every precision this way, and the torch export stays
the one in export/onnx.py.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from core.config import ConfigError

# precision -> (ModelOpt quantize_mode, default calibration method)
PRECISIONS = {"int8": ("int8", "max"), "int8_sq": ("int8", "max"), "fp8": ("fp8", "max"),
              "int4_awq": ("int4", "awq_clip")}
METHODS = {"int8": ("max", "entropy"), "int8_sq": ("max", "entropy"), "fp8": ("max",),
           "int4_awq": ("awq_clip", "awq_lite")}
QUANT_TYPES = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4,
               TensorProto.FLOAT8E4M3FN, TensorProto.INT16, TensorProto.UINT16}
SQ_ALPHA = 0.5
# what this file does to a graph: bump it when that changes, so files quantized before are redone
QUANTIZER_VERSION = 2


def modelopt_version() -> str | None:
    """The installed nvidia-modelopt (None without it): recorded with what it quantized."""
    import importlib.metadata
    try:
        return importlib.metadata.version("nvidia-modelopt")
    except importlib.metadata.PackageNotFoundError:
        return None


class NothingToQuantize(ConfigError):
    """A graph with no MatMul the precision can take (e.g. INT4 on the all-Gemm vision tower)."""


class Samples:
    """ONNX Runtime's CalibrationDataReader over a list of input dicts (what ModelOpt reads)."""

    def __init__(self, samples: list[dict]):
        if not samples:
            raise ConfigError("calibration: no samples for this graph (record the calibration set first)")
        self.samples, self.it = samples, iter(samples)

    def get_next(self):
        return next(self.it, None)

    def get_first(self):
        return self.samples[0]

    def rewind(self):
        self.it = iter(self.samples)

    def __iter__(self):
        return iter(self.samples)

    def __len__(self):
        return len(self.samples)


def one_shape(samples: list[dict]) -> list[dict]:
    """The samples whose input shapes are the most common ones (INT4 AWQ stacks activations)."""
    sig = [tuple((k, v.shape) for k, v in sorted(s.items())) for s in samples]
    best = Counter(sig).most_common(1)[0][0]
    return [s for s, g in zip(samples, sig) if g == best]


def quantize_graph(src: Path, dst: Path, samples: list[dict], precision: str, method: str | None = None,
                   alpha: float = SQ_ALPHA) -> dict:
    """Quantize `src` into `dst`; -> what was done (precision, method, samples, Q/DQ counts)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: calibration makes {sorted(PRECISIONS)}")
    mode, default = PRECISIONS[precision]
    method = method or default
    if method not in METHODS[precision]:
        raise ConfigError(f"calibration method {method!r} for {precision}: one of {list(METHODS[precision])}")
    import modelopt.onnx.quantization as moq

    used = one_shape(samples) if precision == "int4_awq" else samples
    with tempfile.TemporaryDirectory() as tmp:
        # ModelOpt rewrites the file it is given (shape inference, opset): it gets a copy
        source, info = Path(tmp) / "source.onnx", {}
        model = onnx.load(str(src))
        props = list(model.metadata_props)      # what the graph was exported for ("specdrive.rope")
        if precision == "int8_sq":
            info["smoothed_matmuls"] = smooth_graph(model, samples, alpha)
        onnx.save(model, str(source))
        raw, excluded = Path(tmp) / "quantized.onnx", []
        if precision == "int4_awq":     # ModelOpt 0.47's INT4 blocks on a Gemm (transposed weight)
            excluded = [n.name for n in model.graph.node if n.op_type == "Gemm"]   # do not run: failing_matmul
        limit = len(excluded) + MAX_EXCLUDED
        while True:
            with quiet():
                moq.quantize(str(source), quantize_mode=mode, calibration_data_reader=Samples(used),
                             calibration_method=method, output_path=str(raw), high_precision_dtype="fp32",
                             op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=[f"^{re.escape(n)}$" for n in excluded],   # regexes
                             calibration_eps=["cpu"], log_level="ERROR")
            model = onnx.load(str(raw))
            added = explicit_zero_points(model)
            bad = failing_matmul(model, used[0])
            if bad is None:
                break
            if bad in excluded or len(excluded) >= limit:
                raise ConfigError(f"{src}: the {precision} graph does not run in ONNX Runtime even with "
                                  f"{excluded} left in high precision (last failure at {bad!r})")
            excluded.append(bad)
    check_zero_points(model)
    keep_metadata(model, props)
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    if not dq:
        raise NothingToQuantize(f"{Path(src).name}: nothing in it can be quantized to {precision} here"
                                + (f" ({len(excluded)} MatMul/Gemm left out: {excluded[:3]}...)" if excluded else ""))
    onnx.save(model, str(dst))
    return {"precision": precision, "method": method, "samples": len(used), "dequantize_nodes": len(dq),
            "zero_points_added": added, "excluded": excluded,
            **({"alpha": alpha} if precision == "int8_sq" else {}), **info}


MAX_EXCLUDED = 8
GEMMS = ("MatMul", "Gemm")     # ModelOpt's INT4 path also takes Gemm (the patch embedding)


def failing_matmul(model: onnx.ModelProto, sample: dict) -> str | None:
    """Run the quantized graph once in ONNX Runtime; None when it runs. A DequantizeLinear it
    cannot run (ModelOpt 0.47's INT4 blocks on the vision tower's patch-embedding Gemm, whose
    weight is transposed, get scales of the wrong shape) -> the name of the MatMul / Gemm it
    feeds, to leave that one in high precision.
    Any other failure is an error."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        sess.run(None, sample)
        return None
    except Exception as e:          # onnxruntime raises its own exception types
        text = str(e)
    found = re.search(r"Name:'([^']+)'", text)
    nodes = {n.name: n for n in model.graph.node}
    node = nodes.get(found.group(1)) if found else None
    if node is None or node.op_type != "DequantizeLinear":
        raise ConfigError(f"the quantized graph does not run in ONNX Runtime: {text[:400]}")
    users, frontier = [], [node.output[0]]
    for _ in range(4):              # DQ -> (Transpose / Reshape / Cast ...) -> MatMul or Gemm
        nxt = [n for n in model.graph.node if set(frontier) & set(n.input)]
        users += [n.name for n in nxt if n.op_type in GEMMS]
        frontier = [o for n in nxt if n.op_type not in GEMMS for o in n.output]
        if users or not frontier:
            break
    if not users:
        raise ConfigError(f"the quantized graph does not run in ONNX Runtime at {node.name!r}: {text[:400]}")
    return users[0]


@contextlib.contextmanager
def quiet():
    """ModelOpt logs per node and warns about the missing GPU: keep it out of the progress lines."""
    levels = {n: logging.getLogger(n).level for n in ("modelopt", "root")}
    for n in levels:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)


def explicit_zero_points(model: onnx.ModelProto) -> int:
    """Give every DequantizeLinear without a zero point one of zeros (its input's type, its scale's
    shape); -> how many were added."""
    types = value_types(model)
    inits = {t.name: t for t in model.graph.initializer}
    added = 0
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or (len(n.input) > 2 and n.input[2]):
            continue
        qtype = types.get(n.input[0])
        scale = inits.get(n.input[1])
        if qtype is None or scale is None:
            raise ConfigError(f"DequantizeLinear {n.name!r}: cannot tell the type of {n.input[0]!r} or the "
                              "shape of its scale, so no explicit zero point can be added")
        zp = helper.make_tensor(f"{n.name}_zero_point", qtype, list(scale.dims),
                                np.zeros(int(np.prod(scale.dims, dtype=np.int64)), np.int64).tolist())
        model.graph.initializer.append(zp)
        while len(n.input) < 2:
            n.input.append("")
        if len(n.input) == 2:
            n.input.append(zp.name)
        else:
            n.input[2] = zp.name
        added += 1
    return added


def keep_metadata(model: onnx.ModelProto, props) -> None:
    """The source graph's metadata_props entries the quantizer dropped, put back (the runtime
    refuses a graph without the rotary facts it was exported for)."""
    have = {p.key for p in model.metadata_props}
    for prop in props:
        if prop.key not in have:
            model.metadata_props.add().CopyFrom(prop)


def check_zero_points(model: onnx.ModelProto) -> None:
    bad = [n.name for n in model.graph.node
           if n.op_type == "DequantizeLinear" and (len(n.input) < 3 or not n.input[2])]
    if bad:
        raise ConfigError(f"{len(bad)} DequantizeLinear nodes without a zero point (e.g. {bad[:3]})")


def value_types(model: onnx.ModelProto) -> dict:
    """Element type of every initializer and of every Q output (enough to type a DQ's input)."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            zp = types.get(n.input[2]) if len(n.input) > 2 and n.input[2] else TensorProto.UINT8
            types[n.output[0]] = zp
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    for v in [*model.graph.value_info, *model.graph.input]:
        if v.type.tensor_type.elem_type in QUANT_TYPES:
            types.setdefault(v.name, v.type.tensor_type.elem_type)
    return types


def quantized_types(model: onnx.ModelProto) -> dict:
    """{element type name: DequantizeLinear count}: what the graph holds in fact."""
    types = value_types(model)
    return dict(Counter(TensorProto.DataType.Name(types.get(n.input[0], 0))
                        for n in model.graph.node if n.op_type == "DequantizeLinear"))


# --- SmoothQuant on the ONNX graph -------------------------------------------------------------

def weight_matmuls(model: onnx.ModelProto) -> dict:
    """{activation tensor: [MatMul nodes that multiply it by a 2-D constant weight (in, out)]}."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2:
            out.setdefault(n.input[0], []).append(n)
    return out


def activation_max(model: onnx.ModelProto, names: list[str], samples: list[dict]) -> dict:
    """Per-channel max |x| of the tensors `names` over the samples (the last axis is the channel)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for name in names:
        if name not in have:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    amax: dict = {}
    for s in samples:
        for name, value in zip(names, sess.run(names, s)):
            m = np.abs(value.reshape(-1, value.shape[-1])).max(0)
            amax[name] = np.maximum(amax[name], m) if name in amax else m
    return amax


def smooth_graph(model: onnx.ModelProto, samples: list[dict], alpha: float = SQ_ALPHA) -> int:
    """SmoothQuant in place (module docstring); -> the number of MatMuls smoothed."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"SmoothQuant alpha={alpha}: between 0 and 1 (0.5 is the paper's default)")
    groups = weight_matmuls(model)
    amax = activation_max(model, list(groups), samples)
    inits = {t.name: t for t in model.graph.initializer}
    done, new_nodes = 0, {}
    for act, nodes in groups.items():
        weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        if any(w.shape[0] != amax[act].shape[0] for w in weights):
            continue
        wmax = np.max([np.abs(w).max(1) for w in weights], 0)
        s = np.power(np.maximum(amax[act], 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1.0 - alpha)
        s = np.clip(s, 1e-2, 1e2).astype(np.float32)
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{act}_smooth_inv")
        model.graph.initializer.append(inv)
        smoothed = f"{act}_smoothed"
        new_nodes[act] = helper.make_node("Mul", [act, inv.name], [smoothed], name=f"{act}_smooth")
        for n, w in zip(nodes, weights):
            scaled = numpy_helper.from_array((w * s[:, None]).astype(np.float32), f"{n.input[1]}_smoothed")
            model.graph.initializer.append(scaled)
            n.input[0], n.input[1] = smoothed, scaled.name
            done += 1
    # insert each Mul right before its first consumer (keeps the node list topologically sorted)
    order = []
    for n in model.graph.node:
        firsts = [a for a in list(new_nodes) if f"{a}_smoothed" in n.input]
        order += [new_nodes.pop(a) for a in firsts]
        order.append(n)
    del model.graph.node[:]
    model.graph.node.extend(order)
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return done
