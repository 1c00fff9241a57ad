"""Token trees on the TensorRT backend (runtime/tree.py): the step_tree engine's passes, padded to
a captured tree width, the draft's tree as a chain with its siblings, and the accepted path's rows
moved on the device. A part of TensorRTBackend (backend.py), beside its core step."""
from __future__ import annotations

import numpy as np

from core.graphs import STEP, STEP_TREE
from runtime.tree import TreeBuilder


class TreePasses:
    """The token-tree calls of TensorRTBackend: they use its engines, buffers and core copies
    (step inputs, cache rows, read-back)."""

    @property
    def takes_trees(self) -> bool:
        """The build has a step_tree engine at the step's precision (builds before token trees
        have none: rebuild)."""
        g = self.meta.graphs
        return STEP_TREE in self.engines and g[STEP_TREE].precision == g[STEP].precision

    @property
    def tree_width(self) -> int | None:
        return self.tree_widths[-1] if self.tree_widths else None

    def capture_trees(self) -> None:
        """Warm-up: every tree width's pass (a chain of token 0) captured."""
        for w in self.tree_widths if self.takes_trees else ():
            self._step_tree(np.zeros(w, np.int64), 0, np.arange(w), np.tri(w, dtype=bool), capture=True)

    def draft_tree(self, tokens, start: int, shape):
        """The draft engines take no tree mask, so the best node of each depth is fed (a chain of
        draft calls, as on onnxruntime) and each call's masked logits row comes back for its
        node's top-K: the tree is that chain with its siblings."""
        b, n0, node = TreeBuilder(shape, expand=1), len(tokens), None

        def expand(j: int, logits: np.ndarray):
            nonlocal node
            ids, logp = self.draft_topk(logits, shape.topk)
            if node is None:
                b.root(ids, logp)
            else:
                b.children([node], [start + n0 + j - 1], ids[None], logp[None])
            nodes = b.expand()
            node = None if nodes is None else nodes[0]
            return None if node is None else b.tokens[node]
        self.draft_calls(tokens, start, shape.depth, expand)
        return b.tree()

    def verify_tree(self, tokens, start: int, readout: str, offsets, mask) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        self.check_rows(start, len(tokens))
        self._step_tree(tokens, start, np.asarray(offsets, np.int64), np.asarray(mask, bool))
        return self.read_rows(self.engines[STEP_TREE], 0, len(tokens), readout)

    def keep_rows(self, start: int, rows, draft_start: int, draft_rows) -> None:
        """Row by row, in path order: a path's rows increase and each lies at or after the row it
        moves to, so none is overwritten before it is read."""
        F, s = self.feat_dim, self.stream
        for cache, src, dst in ((self.cache, rows, start), (self.draft_cache, draft_rows, draft_start)):
            for j, r in enumerate(np.asarray(src, np.int64).tolist()):
                if r != dst + j:
                    self.cuda.blocks(cache.row(dst + j), cache.pitch, cache.row(r), cache.pitch,
                                     cache.row_bytes, cache.blocks, s)
                    if cache is self.cache and self.fused:      # row r's features at index r + 1
                        self.cuda.d2d(self.feats.at((dst + j + 1) * F), self.feats.at((r + 1) * F),
                                      self.feats.bytes(F), s)
        self.cuda("cudaEventRecord", self.kv_ready, s)

    def _step_tree(self, tokens: np.ndarray, start: int, offsets: np.ndarray, mask: np.ndarray,
                   capture: bool = False) -> None:
        """Target pass over a tree's n rows at `start` (positions start + offsets, the (n, n) tree
        mask), padded to the smallest tree width w >= n whose rows fit the cache, so it replays
        that width's CUDA graph (no such width: n rows, eagerly). A pad row is token 0 at the first
        pending row's position that sees the prefix and itself, and no row sees it; its K/V lands
        past the tree, in rows written again before anything reads them. Host to device: the w ids, cos/sin rows
        and the (w, w) mask; the allowed rows are copied on the device."""
        n, e, cuda, s = len(tokens), self.engines[STEP_TREE], self.cuda, self.stream
        w = next((b for b in self.tree_widths if b >= n and start + b <= self.max_len), n)
        hd, V = self.meta.target.head_dim, self.vocab_size
        offsets = np.concatenate([offsets, np.zeros(w - n, np.int64)])
        self.ids_host[:w] = np.concatenate([tokens, np.zeros(w - n, np.int64)])
        cuda.h2d(e.io.ids.ptr, self.ids_host[:w], s)
        tree = self.staging("tree", (w, w), np.bool_)
        tree[:] = np.eye(w, dtype=bool)
        tree[:n, :n] = mask
        cuda.h2d(e.io.tree.ptr, tree, s)
        tables = self.target_rope((start + offsets + self.delta)[None])
        for name, dst, table in zip(("cos", "sin"), (e.io.cos, e.io.sin), tables):
            host = self.staging("tree_" + name, (w, hd), np.float32)
            host[:] = table.reshape(w, hd)
            cuda.h2d(dst.ptr, host, s)
        self.copy_start(e, start)
        self._tree_mask_rows(e.io.allowed, start + 1, offsets)
        run = self.tree_graphs.capture if capture else self.tree_graphs.run
        run(w, {"ids": (1, w), "cos": (1, w, hd), "sin": (1, w, hd), "allowed": (w, V), "tree": (w, w)})
        self.write_rows(self.cache, e.io.new_kv.ptr, start, w)
        if self.fused:
            self.copy_feats(e, start, w)
        cuda("cudaEventRecord", self.kv_ready, s)

    def _tree_mask_rows(self, dst, index0: int, offsets: np.ndarray) -> None:
        """Mask rows index0 + offsets[i] into row i of dst (a Buffer). The tiled table repeats with
        the period P, so row i may read table row i + ((index0 + offsets[i] - first - i) mod P):
        runs of consecutive table rows go in one copy each (a period-1 mask: one copy in all)."""
        i, V = np.arange(len(offsets)), self.vocab_size
        rows = i + (index0 + offsets - self.mask_first - i) % self.mask_period
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        for a, b in zip([0, *cuts], [*cuts, len(rows)]):
            self.cuda.d2d(dst.at(int(a) * V), self.mask.at(int(rows[a]) * V), self.mask.bytes(int(b - a) * V),
                          self.stream)
