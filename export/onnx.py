"""ONNX export of a planner checkpoint folder: the graphs the ONNX Runtime backend (and, later,
TensorRT) runs, traced from the models' one forward, with a meta.json that says what they are.

    specdrive export onnx --checkpoint DIR --out DIR [--draft NAME] [--max-len N] [--k-max K]

Graphs (opset 18, fp32, standard ONNX ops; T = a dynamic row count, L = max_len):

    vision          patches (P, C*tp*p*p)                       -> image_embeds (N, D), deepstack (S, N, D)
    vision_frame    the same for one image (P / images rows): the runtime encodes only the frames a
                    planner has not seen (reuse.vision); images are encoded independently
    prefill         ids (1, T), cos, sin (1, T, hd), image_embeds, deepstack, allowed (T, V)
                    -> logits (1, T, V) masked, argmax (1, T), feats (1, T, F), kv (layers, 2, 1, KVH, T, hd)
    step            ids (1, T), cos, sin, cache (layers, 2, 1, KVH, L, hd), start (1,), allowed
                    -> logits, argmax, feats, new_kv (the T new rows; the host writes them by index)
    step_tree       the same with tree (T, T) bool: row i sees the prefix and this call's rows j with
                    tree[i, j] (a token tree: runtime/tree.py; per-node positions are in cos/sin)
    draft_prefill   ids, cos, sin, features (1, T, F) | none, image_embeds -> kv
    draft_feed      ids, cos, sin, cache, start, [features (1, T, F)], allowed
                    -> logits, argmax, hidden (1, T, D), new_kv
    draft_chain     the same with features = the draft's own hidden (1, T, D) (fused drafts)
    action_velocity x (B, W, A), t (B,), context (layers, 2, 1, KVH, R, hd), cos, sin (B, W, hd) -> v
    action_output   x (B*S, W, A) integrated flow, v0 (B,) -> waypoints (B, W, 3)   (S, combine fixed)

Rotary cos/sin are inputs (the host builds them with prompt.positions.rope_tables), so M-RoPE
and FlatRoPE share one attention graph. The step graphs read the cache and return only the new
rows: inside the graph the models' forward writes them into its own per-layer copy of the cache,
which costs one cache copy per call in ONNX Runtime (ONNX has no in-place update of an input); the
backend's cache is written once per call, by index, and never concatenated. The Euler loop of the
action expert runs on the host (one velocity call per step) so the steps are a runtime choice;
the noise is an input the host draws. How this relates to the Hugging Face export (`save_hf`):
that one writes weights for transformers; this one writes graphs for an engine.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io as io_
import json
import logging
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models import io
from models.draft import Draft
from models.layers import tree_mask
from core.config import ConfigError, file_sha256, to_dict
from prompt.draft_vocab import d2t_sha256
from core.graphs import (ACTION_OUTPUT, ACTION_VELOCITY, DRAFT_CHAIN, DRAFT_FEED, DRAFT_GRAPHS, DRAFT_PREFILL, FEATS,
                           IMAGE_BLOCKS, PREFILL, SHAPES, STEP, STEP_TREE, VISION, VISION_FRAME, graph_io as declared_io)
from core.artifacts import OPSET, ActionShapes, DraftVocab, EnginesMeta, ExportSource, Graph, LlmDims, PromptShapes, \
    TensorSpec, VisionDims
from prompt.pixels import images_to_patches

DRAFT_MAPS = ("graph", "host")


class VisionGraph(nn.Module):
    """Camera patches -> merged vision embeddings and DeepStack features (grid fixed)."""

    def __init__(self, target, grid):
        super().__init__()
        self.target, self.grid = target, grid

    def forward(self, patches):
        embeds, deep = self.target.encode_images(patches, self.grid)
        deep = torch.stack(list(deep)) if deep else torch.zeros(0, *embeds.shape, dtype=embeds.dtype)
        return embeds, deep


def masked(logits, allowed):
    """Masked logits (-inf where not allowed) and their arg-max: a greedy host reads integers."""
    logits = logits.float().masked_fill(~allowed[None], float("-inf"))
    return logits, logits.argmax(-1)


class PrefillGraph(nn.Module):
    def __init__(self, target, feature_layers):
        super().__init__()
        self.target, self.layers = target, tuple(feature_layers)

    def forward(self, ids, cos, sin, image_embeds, deepstack, allowed):
        t = self.target
        cache = per_layer(t.new_cache(1, ids.shape[1]))       # rows 0..T-1: all of them new
        logits, hid = t(ids, cos, sin, cache, 0, image_embeds, list(deepstack.unbind(0)), self.layers)
        return (*masked(logits, allowed), features(hid, ids), stacked(cache))


class StepGraph(nn.Module):
    def __init__(self, target, feature_layers):
        super().__init__()
        self.target, self.layers = target, tuple(feature_layers)

    def forward(self, ids, cos, sin, cache, start, allowed):
        cache = per_layer(cache)                              # the graph's copy (see the module doc)
        logits, hid = self.target(ids, cos, sin, cache, start, hidden_layers=self.layers)
        return (*masked(logits, allowed), features(hid, ids), new_rows(cache, start, ids.shape[1]))


class StepTreeGraph(StepGraph):
    """The step over a token tree: tree (T, T) bool on the same width axis (models.layers.tree_mask)."""

    def forward(self, ids, cos, sin, cache, start, allowed, tree):
        cache = per_layer(cache)
        mask = tree_mask(start, tree, cache[0][0].shape[-2])
        logits, hid = self.target(ids, cos, sin, cache, start, hidden_layers=self.layers, tree=mask)
        return (*masked(logits, allowed), features(hid, ids), new_rows(cache, start, ids.shape[1]))


class ImageBlocksGraph(nn.Module):
    """n image blocks of a frame_local target on their own (Target.image_block_kv): ids (n, L),
    cos/sin (n, L, hd), image_embeds (n, P, D), deepstack (S, n, P, D) -> kv (layers, 2, n, KVH,
    L, hd) with K before rope, feats (n, L, F)."""

    def __init__(self, target, feature_layers):
        super().__init__()
        self.target, self.layers = target, tuple(feature_layers)

    def forward(self, ids, cos, sin, image_embeds, deepstack):
        embeds = image_embeds.reshape(-1, image_embeds.shape[-1])
        deep = list(deepstack.reshape(deepstack.shape[0], -1, deepstack.shape[-1]).unbind(0))
        kv, hid = self.target.image_block_kv(ids, cos, sin, embeds, deep, self.layers)
        return torch.stack([torch.stack([k, v]) for k, v in kv]), features(hid, ids)


def features(hid, ids):
    return torch.cat(hid, -1) if hid else torch.zeros(*ids.shape, 1)


def per_layer(cache):
    """(layers, 2, 1, KVH, L, hd) -> [[K, V] per layer], independent copies: a layer's write then
    updates its own K and V only. (Writes into views of one shared copy trace into scatters that
    rewrite the whole base once per layer: measured 95 ms per step instead of ~6.)"""
    return [[kv.clone() for kv in layer.unbind(0)] for layer in cache.unbind(0)]


def stacked(cache: list, rows=None):
    """[[K, V] per layer] (rows `rows` of each, or all) -> (layers, 2, 1, KVH, n, hd)."""
    pick = (lambda t: t) if rows is None else (lambda t: t.index_select(2, rows))
    return torch.stack([torch.stack([pick(k), pick(v)]) for k, v in cache])


def new_rows(cache: list, start, n: int):
    """(layers, 2, 1, KVH, n, hd): the rows start .. start+n-1 the forward just wrote."""
    return stacked(cache, start + torch.arange(n))


class DraftPrefillGraph(nn.Module):
    def __init__(self, draft: Draft, fused: bool):
        super().__init__()
        self.draft, self.fused = draft, fused

    def forward(self, ids, cos, sin, image_embeds, feats=None):
        cache = per_layer(self.draft.new_cache(1, ids.shape[1]))
        self.draft(ids, cos, sin, cache, 0, feats if self.fused else None, image_embeds)
        return stacked(cache)


class DraftFeedGraph(nn.Module):
    """head_only (a reduced head, draft map "host"): logits, allowed and argmax over the head's N
    rows (head ids); otherwise over the target vocabulary (Draft.forward's scatter in the graph)."""

    def __init__(self, draft: Draft, fused: bool, head_only: bool = False):
        super().__init__()
        self.draft, self.fused, self.head_only = draft, fused, head_only

    def forward(self, ids, cos, sin, cache, start, allowed, feats=None):
        cache = per_layer(cache)
        logits, hidden = self.draft(ids, cos, sin, cache, start, feats if self.fused else None,
                                    head_only=self.head_only)
        return (*masked(logits, allowed), hidden, new_rows(cache, start, ids.shape[1]))


class VelocityGraph(nn.Module):
    def __init__(self, expert):
        super().__init__()
        self.expert = expert

    def forward(self, x, t, context, cos, sin):
        return self.expert.velocity(x, t, context, context.shape[4], cos, sin)


class OutputGraph(nn.Module):
    def __init__(self, expert, samples: int, combine: str):
        super().__init__()
        self.expert, self.samples, self.combine = expert, samples, combine

    def forward(self, x, v0):
        return self.expert.finish(x, v0, self.samples, self.combine)[0]


@dataclasses.dataclass
class ExportConfig:
    """What to export. Shapes the prompt contract fixes come from the planner profile."""
    max_len: int = SHAPES.max_len
    k_max: int = SHAPES.k_max
    samples: int = 8              # expert draws per trajectory (fixed in action_output)
    combine: str = "mean"
    cameras: int = SHAPES.cameras
    frames: int = SHAPES.frames
    image_hw: tuple = SHAPES.image_hw
    draft_map: str = "graph"      # a reduced draft head: "graph" (draft graphs scatter its logits to
                                  # the target vocabulary, return target ids) or "host" (they return the
                                  # head's N logits and head ids; the host maps them with meta's d2t)

    def __post_init__(self):
        if self.draft_map not in DRAFT_MAPS:
            raise ConfigError(f"draft_map {self.draft_map!r}: allowed {list(DRAFT_MAPS)}")


def export_onnx(checkpoint: Path, out: Path, draft: str | None, cfg: ExportConfig, progress=print,
                reuse: Path | None = None) -> EnginesMeta:
    """Export every graph of the folder's target, expert and one draft to `out`; -> its meta.json
    (as the runtime reads it). `reuse`: an earlier fp32 export of the same target and expert with
    the same shapes (reusable_graphs checks every fact the graphs follow from); its target and
    expert graphs are copied, so only the draft's graphs are exported (seconds, not minutes)."""
    tok, mcfg, target, expert = io.load_planner(checkpoint)
    models, drafts = io.scan_checkpoints(checkpoint)
    name = draft or ("flat" if "flat" in drafts else next(iter(drafts), None))
    if name not in drafts:
        raise ConfigError(f"--draft {name!r}: {checkpoint} has the drafts {sorted(drafts)}")
    mcfg, dmodel, _ = io.load_draft(drafts[name], mcfg, target, tok, io.target_sha256(models))
    out.mkdir(parents=True, exist_ok=True)
    shapes = _shapes(mcfg, cfg, tok)
    fused = mcfg.draft.features == "fused"
    layers = tuple(mcfg.draft.feature_layers) if fused else ()
    graphs = {}
    host_map = bool(mcfg.draft.vocab) and cfg.draft_map == "host"
    rope = rope_facts(mcfg)
    reused = {}
    if reuse is not None:
        reused = reusable_graphs(Path(reuse), models, mcfg, cfg, shapes, tok, rope)
    for gname, module, args, names, dyn in _graphs(target, expert, dmodel, fused, layers, shapes, cfg, host_map):
        if gname in reused:
            if Path(reuse).resolve() != out.resolve():
                shutil.copy(Path(reuse) / reused[gname].file, out / reused[gname].file)
            graphs[gname] = reused[gname]
            progress(f"reused {gname}.onnx from {reuse}")
            continue
        t0 = time.perf_counter()
        graphs[gname] = _export(module.eval(), args, names, dyn, out / f"{gname}.onnx", rope)
        progress(f"exported {gname}.onnx ({time.perf_counter() - t0:.1f} s)")
    shutil.copy(Path(checkpoint) / "tokenizer.json", out / "tokenizer.json")
    meta = _meta(out, checkpoint, models, drafts[name], name, mcfg, cfg, shapes, graphs, tok,
                 draft_vocab_card(dmodel, cfg.draft_map))
    meta.write(out)
    return meta


def reusable_graphs(folder: Path, models: dict, mcfg, cfg: ExportConfig, shapes: dict, tok, rope: dict) -> dict:
    """{name: Graph} of the target and expert graphs an earlier export in `folder` holds, when every
    fact they follow from is this export's: the target and expert weights (their modules' sha256),
    the tokenizer, max_len, k_max, the prompt, vision and action shapes, the target's dimensions,
    the draft's feature wiring (a fused draft's layers change the target graphs' outputs) and the
    rotary facts stamped in each graph. A ConfigError names every fact that differs; a graph file
    whose sha256 is not the one its meta.json records is refused."""
    import onnx

    from core.artifacts import read_engines_meta

    old = read_engines_meta(folder)
    where = f"--reuse {folder}"
    if old.precision != {"*": "fp32"} or old.fp32_graphs:
        raise ConfigError(f"{where}: its graphs are {old.precision} (calibrated); reuse takes an fp32 export")
    fused = mcfg.draft.features == "fused"
    want = {
        "target weights": {k: v.sha256 for k, v in io.read_meta(models["target"]).modules.items()},
        "expert weights": {k: v.sha256 for k, v in io.read_meta(models["expert"]).modules.items()},
        "tokenizer": tok.fingerprint, "max_len": cfg.max_len, "k_max": cfg.k_max,
        **_shape_facts(mcfg, cfg, shapes),
        "draft features": (mcfg.draft.features, list(mcfg.draft.feature_layers) if fused else [])}
    sources = old.source.models if old.source else {}
    have = {
        "target weights": sources.get("target", {}).get("modules"),
        "expert weights": sources.get("expert", {}).get("modules"),
        "tokenizer": old.tokenizer_sha256, "max_len": old.max_len, "k_max": old.k_max, "prompt": old.prompt,
        "vision": old.vision, "target": old.target, "action": old.action,
        "draft features": (old.draft_features, list(old.raw.get("feature_layers") or []))}
    differ = [k for k in want if want[k] != have[k]]
    if differ:
        raise ConfigError(f"{where}: its graphs were exported for other facts ({', '.join(differ)}); "
                          "reuse takes an export of the same target and expert with the same shapes")
    out = {}
    stamp = json.dumps(rope, sort_keys=True)
    for name, g in old.graphs.items():
        if name in DRAFT_GRAPHS:
            continue
        path = Path(folder) / g.file
        if file_sha256(path) != g.sha256:
            raise ConfigError(f"{where}: {g.file} is not the file its meta.json records (sha256 differs)")
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        if props.get(ROPE_KEY) != stamp:
            raise ConfigError(f"{where}: {g.file} was exported for other rotary facts ({ROPE_KEY}); "
                              "reuse takes an export whose draft has the same rope")
        out[name] = g
    return out


def _shapes(mcfg, cfg: ExportConfig, tok) -> dict:
    v = mcfg.target.vision
    h, w = cfg.image_hw
    side = v.patch * v.merge
    if h % side or w % side:
        raise ConfigError(f"image_hw {h}x{w} must be a multiple of patch*merge={side}")
    n_img = cfg.cameras * cfg.frames
    grid = [[1, h // v.patch, w // v.patch]] * n_img
    patches, _ = images_to_patches(np.zeros((n_img, h, w, 3), np.uint8), v.patch, v.temporal_patch, v.merge)
    llm = mcfg.target.llm
    return {"grid": grid, "patches": list(patches.shape),
            "frame_patches": [patches.shape[0] // n_img, patches.shape[1]], "image_tokens": n_img * (h // side) * (w // side),
            "vocab": len(tok), "hidden": llm.hidden, "layers": llm.layers, "kv_heads": llm.kv_heads,
            "head_dim": llm.head_dim}


def _graphs(target, expert, draft, fused, layers, s, cfg: ExportConfig, host_map: bool = False):
    """(name, module, example args, (input names, output names), dynamic axes) per graph."""
    T, V, D, hd, N = 7, s["vocab"], s["hidden"], s["head_dim"], s["image_tokens"]
    dl = draft.llm
    ids = torch.randint(0, V, (1, T))
    cos, sin = torch.ones(1, T, hd), torch.zeros(1, T, hd)
    dcos, dsin = torch.ones(1, T, dl.head_dim), torch.zeros(1, T, dl.head_dim)
    allowed = torch.ones(T, V, dtype=torch.bool)
    start = torch.tensor([3])
    cache = target.new_cache(1, cfg.max_len)
    dcache = draft.new_cache(1, cfg.max_len)
    F = 3 * D if fused else 1
    n_deep = len(target.cfg.vision.deepstack_layers)
    img = (torch.randn(N, D), torch.randn(n_deep, N, D))
    pids = torch.full((1, N + 3), 5)
    pids[0, 1:N + 1] = target.cfg.image_token_id
    pcos, psin = torch.ones(1, N + 3, hd), torch.zeros(1, N + 3, hd)
    W, A = expert.cfg.n_waypoints, expert.cfg.action_dim
    row = {1: "T"}
    feats = "fused" if fused else "none"

    def graph(name, module, args, dynamic):
        io = declared_io(name, feats)
        return name, module, args, (list(io.inputs), list(io.outputs)), dynamic
    out = [
        graph(VISION, VisionGraph(target, s["grid"]), (torch.randn(*s["patches"]),), None),
        graph(VISION_FRAME, VisionGraph(target, s["grid"][:1]), (torch.randn(*s["frame_patches"]),), None),
        graph(PREFILL, PrefillGraph(target, layers), (pids, pcos, psin, *img, torch.ones(N + 3, V, dtype=torch.bool)),
              {"ids": row, "cos": row, "sin": row, "image_embeds": None, "deepstack": None, "allowed": {0: "T"}}),
        graph(STEP, StepGraph(target, layers), (ids, cos, sin, cache, start, allowed),
              {"ids": row, "cos": row, "sin": row, "cache": None, "start": None, "allowed": {0: "T"}}),
        graph(STEP_TREE, StepTreeGraph(target, layers),
              (ids, cos, sin, cache, start, allowed, torch.tril(torch.ones(T, T, dtype=torch.bool))),
              {"ids": row, "cos": row, "sin": row, "cache": None, "start": None, "allowed": {0: "T"},
               "tree": {0: "T", 1: "T"}}),
    ]
    if target.cfg.llm.image_attention == "frame_local":     # streaming prefill (reuse.prefill)
        P, nb = N // (cfg.cameras * cfg.frames), 2
        bids = torch.full((nb, P + 2), 5)
        bids[:, 1:P + 1] = target.cfg.image_token_id
        blk = {0: "n"}
        out.append(graph(IMAGE_BLOCKS, ImageBlocksGraph(target, layers),
                         (bids, torch.ones(nb, P + 2, hd), torch.zeros(nb, P + 2, hd), torch.randn(nb, P, D),
                          torch.randn(n_deep, nb, P, D)),
                         {"ids": blk, "cos": blk, "sin": blk, "image_embeds": blk, "deepstack": {1: "n"}}))
    dp_args = (pids, torch.ones(1, N + 3, dl.head_dim), torch.zeros(1, N + 3, dl.head_dim), img[0])
    dp_dyn = {"ids": row, "cos": row, "sin": row, "image_embeds": None}
    feed_args = (ids, dcos, dsin, dcache, start,
                 torch.ones(T, draft.cfg.vocab, dtype=torch.bool) if host_map else allowed)
    feed_dyn = {"ids": row, "cos": row, "sin": row, "cache": None, "start": None, "allowed": {0: "T"}}
    if fused:
        out.append(graph(DRAFT_PREFILL, DraftPrefillGraph(draft, True), (*dp_args, torch.randn(1, N + 3, F)),
                         {**dp_dyn, FEATS: row}))
        out.append(graph(DRAFT_FEED, DraftFeedGraph(draft, True, host_map), (*feed_args, torch.randn(1, T, F)),
                         {**feed_dyn, FEATS: row}))
        out.append(graph(DRAFT_CHAIN, DraftFeedGraph(draft, True, host_map), (*feed_args, torch.randn(1, T, D)),
                         {**feed_dyn, FEATS: row}))
    else:
        out.append(graph(DRAFT_PREFILL, DraftPrefillGraph(draft, False), dp_args, dp_dyn))
        out.append(graph(DRAFT_FEED, DraftFeedGraph(draft, False, host_map), feed_args, feed_dyn))
    B, R = cfg.samples, 11
    ctx = torch.randn(s["layers"], 2, 1, s["kv_heads"], R, hd)
    out.append(graph(ACTION_VELOCITY, VelocityGraph(expert),
                     (torch.randn(B, W, A), torch.rand(B), ctx, torch.ones(B, W, hd), torch.zeros(B, W, hd)),
                     {"x": {0: "B"}, "t": {0: "B"}, "context": {4: "R"}, "cos": {0: "B"}, "sin": {0: "B"}}))
    out.append(graph(ACTION_OUTPUT, OutputGraph(expert, cfg.samples, cfg.combine),
                     (torch.randn(B, W, A), torch.tensor([5.0])), None))
    return out


ROPE_KEY = "specdrive.rope"      # an ONNX graph's metadata_props entry: the rotary facts it was exported for


def rope_facts(mcfg) -> dict:
    """The rotary facts the host builds cos/sin from (target and draft), as the export's graphs
    carry them: the graphs take cos/sin as inputs, so a meta.json whose rope fields were edited
    (its facts hash recomputed) would otherwise still load and plan wrong."""
    t, d = mcfg.target.llm, mcfg.draft_llm()
    out = {name: {"head_dim": m.head_dim, "rope_theta": float(m.rope_theta), "mrope_section": list(m.mrope_section),
                  "interleaved": bool(m.interleaved)} for name, m in (("target", t), ("draft_llm", d))}
    out["target"]["image_attention"] = t.image_attention     # the image mask the host builds from meta.json
    return out


def _export(module, args, names, dynamic, path: Path, rope: dict | None = None) -> dict:
    """torch.onnx.export (dynamo, opset 18) -> the graph's file, hash and I/O (names, shapes, dtypes);
    `rope` (rope_facts) stamped into the graph's metadata_props."""
    inputs, outputs = names
    dyn = None
    if dynamic:
        dyn = {k: ({a: torch.export.Dim(n, min=1, max=1 << 16) for a, n in v.items()} if v else None)
               for k, v in dynamic.items()}
    # the exporter's own chatter (deprecations, optional torchvision ops) is not the user's concern
    with torch.no_grad(), warnings.catch_warnings(), _quiet("torch.onnx", "torch.export"), \
            contextlib.redirect_stdout(io_.StringIO()), _without_slow_rules():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=True, opset_version=OPSET,
                          input_names=inputs, output_names=outputs, dynamic_shapes=dyn,
                          external_data=False, verbose=False)
    if rope is not None:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        entry = model.metadata_props.add()
        entry.key, entry.value = ROPE_KEY, json.dumps(rope, sort_keys=True)
        onnx.save(model, str(path))
    return Graph.new(path.name, file_sha256(path), *graph_io(path))


# onnxscript rewrite rules the exporter's optimizer tries that never apply to these graphs and
# cost most of its time: SlicesSplit (two Slices of one tensor -> Split) matches every pair of
# Slices that share an input, 8.7 of the 12.2 s the optimizer spends on step.onnx here, for no
# rewrite (our rotary halves are not in the shape it wants). Without it every graph of
# checkpoints/tiny is byte for byte the one the full rule set writes (tests/test_onnx.py).
SKIPPED_RULES = ("SlicesSplit",)


@contextlib.contextmanager
def _without_slow_rules():
    """torch.onnx's optimizer (onnxscript's optimize_ir, which reads the default rule list when it
    runs) with SKIPPED_RULES left out, for the length of one export. Where onnxscript has no such
    list (another version), the export runs with its own rules, as before."""
    try:
        from onnxscript import rewriter
    except ImportError:
        yield
        return
    rules = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    if not isinstance(rules, (list, tuple)):
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = type(rules)(r for r in rules if _rule_name(r) not in SKIPPED_RULES)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def _rule_name(rule) -> str:
    return getattr(rule, "name", None) or type(rule).__name__


@contextlib.contextmanager
def _quiet(*loggers):
    levels = [(logging.getLogger(n), logging.getLogger(n).level) for n in loggers]
    for lg, _ in levels:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in levels:
            lg.setLevel(level)


def graph_io(path: Path) -> tuple[tuple, tuple]:
    """(inputs, outputs) of an ONNX file: TensorSpecs of name, shape (ints or axis names) and element type."""
    import onnx
    from onnx import helper

    g = onnx.load(str(path), load_external_data=False).graph

    def spec(v):
        t = v.type.tensor_type
        shape = [d.dim_param or d.dim_value for d in t.shape.dim]
        return TensorSpec(v.name, tuple(shape), helper.tensor_dtype_to_np_dtype(t.elem_type).name)
    return tuple(spec(v) for v in g.input), tuple(spec(v) for v in g.output)


def draft_vocab_card(draft: Draft, draft_map: str) -> DraftVocab | None:
    """meta.json's draft_vocab: None for a full head; else N, the map, its hash and where it is
    applied ("graph": inside the draft graphs; "host": by the backend)."""
    if not draft.cfg.vocab:
        return None
    d2t = draft.d2t.cpu().numpy()
    return DraftVocab(int(draft.cfg.vocab), draft_map, tuple(d2t.tolist()), d2t_sha256(d2t))


def _meta(out, checkpoint, models, draft_dir, name, mcfg, cfg: ExportConfig, shapes, graphs, tok,
          draft_vocab: DraftVocab | None) -> EnginesMeta:
    """The export's card: the facts of its models and shapes, where each model came from."""
    sources = {}
    for kind, folder in {**models, "draft": draft_dir}.items():
        m = io.read_meta(folder)
        sources[kind] = {"folder": str(folder), "modules": {k: v.sha256 for k, v in m.modules.items()}}
    fused = mcfg.draft.features == "fused"
    return EnginesMeta.new(
        out, max_len=cfg.max_len, k_max=cfg.k_max, draft=name, draft_features=mcfg.draft.features,
        draft_rope=mcfg.draft.rope, feature_layers=list(mcfg.draft.feature_layers) if fused else [],
        tokenizer_sha256=tok.fingerprint, **_shape_facts(mcfg, cfg, shapes), draft_llm=_dims(mcfg.draft_llm()),
        graphs=graphs, draft_vocab=draft_vocab, source=ExportSource(str(checkpoint), sources),
        model_config=to_dict(mcfg), torch=torch.__version__, created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _shape_facts(mcfg, cfg: ExportConfig, shapes: dict) -> dict:
    """The prompt, vision, target and action facts of an export (meta.json's fields of those names)."""
    t, e = mcfg.target, mcfg.expert
    return {"prompt": PromptShapes(cfg.cameras, cfg.frames, tuple(cfg.image_hw), shapes["grid"], shapes["image_tokens"]),
            "vision": VisionDims(t.vision.patch, t.vision.temporal_patch, t.vision.merge),
            "target": dataclasses.replace(_dims(t.llm), vocab_size=t.llm.vocab_size, image_token_id=t.image_token_id,
                                          image_attention=t.llm.image_attention),
            "action": ActionShapes(e.euler_steps, cfg.samples, cfg.combine, e.n_waypoints, e.action_dim)}


def _dims(llm) -> LlmDims:
    """A decoder's exported dimensions (a target's vocabulary and image token added by the caller)."""
    return LlmDims(llm.head_dim, llm.rope_theta, tuple(llm.mrope_section), llm.interleaved, llm.layers,
                   llm.kv_heads, llm.hidden)

