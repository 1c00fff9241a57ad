"""The TensorRT backend's device memory as typed sets: every buffer an attribute (`step.io.logits`,
`backend.feats`), every byte size from the buffer's dtype (`Buffer.at`, `Buffer.bytes`).

An engine's I/O buffers are a frozen dataclass per role (the graphs of core/graphs.py IO that take
the same tensors share one), built from the engine's static buffers and the dtypes TensorRT
reports; the backend's own tables (KV caches, features, rotary rows, positions, proposals) are
`Buffer`s and `KVCache`s it allocates once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from core.graphs import (ACTION_OUTPUT, ACTION_VELOCITY, DRAFT_CHAIN, DRAFT_FEED, DRAFT_PREFILL, IMAGE_BLOCKS,
                         PREFILL, STEP, STEP_TREE, VISION, VISION_FRAME)
from runtime.backends.tensorrt.cuda import Cuda


@dataclass(frozen=True)
class Buffer:
    """A device address and the dtype of its elements: offsets and sizes count elements."""
    ptr: int
    dtype: np.dtype

    def at(self, elements: int) -> int:
        """The address `elements` elements past the start."""
        return self.ptr + self.bytes(elements)

    def bytes(self, elements: int) -> int:
        return int(elements) * self.dtype.itemsize


def device_array(cuda: Cuda, elements: int, dtype) -> Buffer:
    """`elements` elements of `dtype` allocated on the device (freed by cuda.close)."""
    dtype = np.dtype(dtype)
    return Buffer(cuda.malloc(int(elements) * dtype.itemsize), dtype)


@dataclass(frozen=True)
class KVCache:
    """(layers, 2, 1, kv_heads, rows, head_dim) KV in device memory: `blocks` (layers * 2 *
    kv_heads) blocks of `rows` rows of head_dim elements, in the dtype the engines bind it at."""
    ptr: int
    blocks: int
    head_dim: int
    rows: int
    dtype: np.dtype

    @property
    def row_bytes(self) -> int:
        return self.head_dim * self.dtype.itemsize

    @property
    def pitch(self) -> int:
        """Bytes from one block to the next."""
        return self.rows * self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.blocks * self.pitch

    def row(self, r: int) -> int:
        """Row r's address in the first block (a block copy strides by `pitch`)."""
        return self.ptr + r * self.row_bytes


def kv_cache(cuda: Cuda, blocks: int, head_dim: int, rows: int, dtype) -> KVCache:
    dtype = np.dtype(dtype)
    return KVCache(cuda.malloc(blocks * rows * head_dim * dtype.itemsize), blocks, head_dim, rows, dtype)


@dataclass(frozen=True)
class RopeRows:
    """cos / sin of every cache row, (rows, head_dim) each."""
    cos: Buffer
    sin: Buffer


# --- an engine's I/O buffers, one set per role ---------------------------------------------------
@dataclass(frozen=True)
class ImageIO:
    """vision, vision_frame."""
    patches: Buffer
    image_embeds: Buffer
    deepstack: Buffer


@dataclass(frozen=True)
class PromptIO:
    """prefill, image_blocks, draft_prefill: a prompt's rows at once (K/V out whole)."""
    ids: Buffer
    cos: Buffer
    sin: Buffer
    image_embeds: Buffer
    kv: Buffer
    deepstack: Optional[Buffer] = None
    allowed: Optional[Buffer] = None
    feats: Optional[Buffer] = None
    logits: Optional[Buffer] = None
    argmax: Optional[Buffer] = None


@dataclass(frozen=True)
class StepIO:
    """step, step_tree, draft_feed, draft_chain: n rows at `start` over the cache."""
    ids: Buffer
    cos: Buffer
    sin: Buffer
    cache: Buffer
    start: Buffer
    allowed: Buffer
    logits: Buffer
    argmax: Buffer
    new_kv: Buffer
    feats: Optional[Buffer] = None
    hidden: Optional[Buffer] = None
    tree: Optional[Buffer] = None


@dataclass(frozen=True)
class VelocityIO:
    """action_velocity."""
    x: Buffer
    t: Buffer
    context: Buffer
    cos: Buffer
    sin: Buffer
    velocity: Buffer


@dataclass(frozen=True)
class OutputIO:
    """action_output."""
    x: Buffer
    v0: Buffer
    waypoints: Buffer


ROLES = {VISION: ImageIO, VISION_FRAME: ImageIO, PREFILL: PromptIO, IMAGE_BLOCKS: PromptIO,
         DRAFT_PREFILL: PromptIO, STEP: StepIO, STEP_TREE: StepIO, DRAFT_FEED: StepIO, DRAFT_CHAIN: StepIO,
         ACTION_VELOCITY: VelocityIO, ACTION_OUTPUT: OutputIO}


def io_set(graph: str, addresses: dict, dtypes: dict):
    """Graph `graph`'s buffers ({tensor: address}, {tensor: dtype}) as its role's typed set (a
    tensor the role does not name is still bound by the engine, just never addressed here)."""
    role = ROLES[graph]
    names = [f.name for f in dataclasses.fields(role) if f.name in addresses]
    return role(**{n: Buffer(int(addresses[n]), np.dtype(dtypes[n])) for n in names})
