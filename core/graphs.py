"""The exported graphs and the shapes engines are made for, declared once.

export/onnx.py writes these graphs under these names with these inputs and outputs; the graph
backends (runtime/backends/onnxruntime.py, tensorrt.py) check meta.json against them and bind
them by name; engines/ builds a precision and an optimization profile per graph; calibration
records their inputs. `SHAPES` holds the shapes every one of them defaults to (the planner
profile, the export, the engine profiles, the projection), so a default changes in one place.

    VISION          patches -> image_embeds, deepstack            (one cycle's images)
    VISION_FRAME    the same for one image (reuse.vision; optional: older exports lack it)
    PREFILL         ids, cos, sin, image_embeds, deepstack, allowed -> logits, argmax, feats, kv
    IMAGE_BLOCKS    ids, cos, sin, image_embeds, deepstack -> kv, feats   (n image blocks on their own:
                    K before rope; frame_local targets only, reuse.prefill)
    STEP            ids, cos, sin, cache, start, allowed -> logits, argmax, feats, new_kv
    DRAFT_PREFILL   ids, cos, sin, image_embeds [, feats] -> kv
    DRAFT_FEED      ids, cos, sin, cache, start, allowed [, feats] -> logits, argmax, hidden, new_kv
    DRAFT_CHAIN     as DRAFT_FEED, feats = the draft's own hidden (fused drafts only)
    ACTION_VELOCITY x, t, context, cos, sin -> velocity
    ACTION_OUTPUT   x, v0 -> waypoints

[, feats]: the input a fused draft (draft_features "fused") has and a standalone one lacks.
Standard library only: every layer may import it.
"""
from __future__ import annotations

from dataclasses import dataclass

VISION, VISION_FRAME = "vision", "vision_frame"
PREFILL, STEP = "prefill", "step"
STEP_TREE = "step_tree"                 # the step with a token tree's (T, T) mask (runtime/tree.py)
IMAGE_BLOCKS = "image_blocks"
DRAFT_PREFILL, DRAFT_FEED, DRAFT_CHAIN = "draft_prefill", "draft_feed", "draft_chain"
ACTION_VELOCITY, ACTION_OUTPUT = "action_velocity", "action_output"
FEATS = "feats"                         # a fused draft's extra input
IMAGE_ATTENTION = ("causal", "frame_local")   # a target's image layout (models LLMConfig.image_attention)
DRAFT_FEATURES = ("fused", "none")      # meta.json draft_features


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


_DRAFT_STEP = GraphIO(("ids", "cos", "sin", "cache", "start", "allowed"), ("logits", "argmax", "hidden", "new_kv"))
IO = {
    VISION: GraphIO(("patches",), ("image_embeds", "deepstack")),
    VISION_FRAME: GraphIO(("patches",), ("image_embeds", "deepstack")),
    PREFILL: GraphIO(("ids", "cos", "sin", "image_embeds", "deepstack", "allowed"), ("logits", "argmax", "feats", "kv")),
    STEP: GraphIO(("ids", "cos", "sin", "cache", "start", "allowed"), ("logits", "argmax", "feats", "new_kv")),
    STEP_TREE: GraphIO(("ids", "cos", "sin", "cache", "start", "allowed", "tree"), ("logits", "argmax", "feats", "new_kv")),
    IMAGE_BLOCKS: GraphIO(("ids", "cos", "sin", "image_embeds", "deepstack"), ("kv", "feats")),
    DRAFT_PREFILL: GraphIO(("ids", "cos", "sin", "image_embeds"), ("kv",)),
    DRAFT_FEED: _DRAFT_STEP,
    DRAFT_CHAIN: _DRAFT_STEP,
    ACTION_VELOCITY: GraphIO(("x", "t", "context", "cos", "sin"), ("velocity",)),
    ACTION_OUTPUT: GraphIO(("x", "v0"), ("waypoints",)),
}
GRAPHS = tuple(IO)                                     # every graph, in export order
OPTIONAL = (VISION_FRAME, IMAGE_BLOCKS, STEP_TREE)     # an export may lack them (image_blocks:
                                                       # only a frame_local target has it; step_tree:
                                                       # exports before token trees)
FUSED_ONLY = (DRAFT_CHAIN,)                            # only a fused draft has it
DRAFT_GRAPHS = (DRAFT_PREFILL, DRAFT_FEED, DRAFT_CHAIN)
TARGET_LLM_GRAPHS = (PREFILL, STEP)
LLM_GRAPHS = TARGET_LLM_GRAPHS + DRAFT_GRAPHS          # the decoder graphs (precision, quantization)
ACTION_GRAPHS = (ACTION_VELOCITY, ACTION_OUTPUT)


def required_graphs(features: str) -> tuple[str, ...]:
    """The graphs an export of a draft with `features` ("fused" or "none") must have."""
    return tuple(g for g in GRAPHS if g not in OPTIONAL and (features == "fused" or g not in FUSED_ONLY))


def graph_io(name: str, features: str) -> GraphIO:
    """Graph `name`'s input and output names for a draft with `features` (a fused draft's
    graphs take `feats`)."""
    io = IO[name]
    if features == "fused" and name in DRAFT_GRAPHS:
        return GraphIO((*io.inputs, FEATS), io.outputs)
    return io


@dataclass(frozen=True)
class EngineShapes:
    """What the caches, graphs and engines are sized for unless a profile says otherwise."""
    max_len: int = 1024             # cache rows: prompt + reasoning + the trajectory tail
    max_prompt: int = 448           # prefill rows an engine profile allows
    k_max: int = 8                  # the largest draft length: verify widths 1..k_max+1
    tree_widths: tuple[int, ...] = (9, 17, 33)   # token-tree verify widths (pending + nodes): TensorRT
                                    # builds step_tree with an optimization profile per width
    cameras: int = 4
    frames: int = 2                 # frames per camera in a cycle's prompt
    image_hw: tuple[int, int] = (64, 96)


SHAPES = EngineShapes()
