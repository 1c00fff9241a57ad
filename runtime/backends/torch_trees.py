"""Token trees on the PyTorch backend (runtime/tree.py): the draft's tree level by level under
tree masks, the target's pass over a tree, and the accepted path's rows moved in place. A part of
TorchBackend (runtime/backends/torch.py), beside its chain calls."""
from __future__ import annotations

import numpy as np
import torch

from core.config import ConfigError
from models.layers import move_rows, tree_mask
from runtime.tree import TreeBuilder


class TorchTrees:
    """The token-tree calls of TorchBackend: they use its models, caches, mask and forwards."""

    @torch.no_grad()
    def draft_tree(self, tokens, start: int, shape):
        """Feed `tokens` at `start` (the root is the last), then expand level by level: the K best
        candidates of a depth are fed in one call at the next free rows, each under a mask of the
        prefix, its ancestors' rows and its own, at the position of its depth."""
        if self.draft_kind == "none":
            raise ConfigError("this backend has no draft (--draft none): use k = 0")
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.device)[None]
        n = ids.shape[1]
        self.check_rows(start, n)
        logits, hidden = self.draft_step(ids, start, self.feed_features(start, n))
        base, K = start + n, shape.topk
        b = TreeBuilder(shape)
        top_ids, top_lp = self._topk(logits[0, -1:], np.array([base]), K)
        b.root(top_ids[0], top_lp[0])
        hid = {-1: hidden[0, -1]} if self.fused else {}
        row = base
        while (nodes := b.expand()) is not None:
            m = len(nodes)
            self.check_rows(row, m)
            pos = np.array([base - 1 + b.depths[x] for x in nodes], np.int64)
            mask = np.zeros((m, self.max_len), bool)
            mask[:, :base] = True
            for i, x in enumerate(nodes):
                mask[i, row + i] = True
                p = b.parents[x]
                while p >= 0:
                    mask[i, b.row_of(p)] = True
                    p = b.parents[p]
            node_ids = torch.as_tensor([b.tokens[x] for x in nodes], device=self.device)[None]
            feat = torch.stack([hid[b.parents[x]] for x in nodes])[None] if self.fused else None
            logits, hidden = self.feed_forward(node_ids, *self._draft_rope_at(pos), row, feat,
                                               tree=torch.from_numpy(mask).to(self.device), kv_len=self.kv(row, m))
            top_ids, top_lp = self._topk(logits[0], pos + 1, K)
            b.children(nodes, range(row, row + m), top_ids, top_lp)
            if self.fused:
                hid.update({x: hidden[0, i] for i, x in enumerate(nodes)})
            row += m
        return b.tree()

    @torch.no_grad()
    def verify_tree(self, tokens, start: int, readout: str, offsets, mask) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.device)[None]
        w = ids.shape[1]
        self.check_rows(start, w)
        offsets = np.asarray(offsets, np.int64)
        pos = torch.as_tensor(start + offsets + self.delta, device=self.device)[None]
        tree = tree_mask(start, torch.as_tensor(np.asarray(mask, bool), device=self.device), self.max_len)
        logits, hid = self.target(ids, *self.target.rope(pos), self.cache, start,
                                  hidden_layers=self.feature_layers, tree=tree, kv_len=self.kv(start, w))
        if self.fused:
            self.feats[start:start + w] = torch.cat(hid, -1)[0]
        masked = self._masked_at(logits[0].float(), start + 1 + offsets)
        return self.read(readout, lambda: self.link.down(masked.argmax(-1)), lambda: self.link.down(masked))

    @torch.no_grad()
    def keep_rows(self, start: int, rows, draft_start: int, draft_rows) -> None:
        _move(self.cache, 4, start, rows, self.device)
        if self.fused:
            _move(self.feats, 0, start, rows, self.device)
        if self.draft_cache is not None and len(draft_rows):
            _move(self.draft_cache, 4, draft_start, draft_rows, self.device)

    def _topk(self, logits: torch.Tensor, index: np.ndarray, k: int):
        """logits (n, V) choosing the tokens at sequence indices `index` (n,) -> top-k ids and
        masked log-probabilities, (n, k) each, on the host."""
        lp = torch.log_softmax(self._masked_at(logits.float(), index), -1)
        val, ids = lp.topk(min(k, lp.shape[-1]), -1)
        return self.link.down(ids), self.link.down(val)

    def _masked_at(self, logits: torch.Tensor, index: np.ndarray) -> torch.Tensor:
        """logits (n, V) choosing the tokens at sequence indices `index` (n,) -> masked fp32."""
        rows = (np.asarray(index, np.int64) - self.mask_first) % len(self.allowed)
        return logits.float().masked_fill(~self.allowed_dev[torch.from_numpy(rows).to(self.device)], float("-inf"))

    def _draft_rope_at(self, pos: np.ndarray):
        """cos, sin of draft rows at chain positions `pos` (n,) (a tree node: its depth's row)."""
        p = torch.as_tensor(np.asarray(pos, np.int64), device=self.device)[None]
        if self.draft_kind == "self" or self.cfg.draft.rope == "mrope":
            return self.target.rope(p + self.delta)
        return self.draft_model.rope(p)


def _move(buf: torch.Tensor, dim: int, start: int, rows, device) -> None:
    """buf's slices `rows` along `dim` -> start, start+1, .. (read first: the ranges may overlap)."""
    rows = np.asarray(rows, np.int64)
    if not len(rows) or np.array_equal(rows, np.arange(start, start + len(rows))):
        return
    move_rows(buf, dim, start, torch.as_tensor(rows, device=device))
