"""Token trees (EAGLE-2 style): drafting a tree, verifying it in one target pass, accepting a path.

numpy only. The backend drafts (`Backend.draft_tree`), verifies (`Backend.verify_tree`) and moves
the accepted rows (`Backend.keep_rows`); the shape, the selection, the layout of the verify pass
and the greedy walk are here, once for every backend.

Drafting, for a shape (nodes N, depth d, top-K): the draft is fed what it has not seen and gives
the root's distribution; its K most likely tokens are the depth-1 candidates, each scored by its
cumulative draft log-probability. At every further depth the K best-scored candidates of the
depth before are fed to the draft together (one call, a tree mask: each sees the prefix and its
ancestors) and each proposes its own K children (score = parent's + log q). Of all candidates
the N best-scored are kept (EAGLE-2's re-ranking). A child never scores above its parent, and ties
go to the shallower node, so the kept set holds every kept node's ancestors: it is a tree.

Verifying: the pending tokens (P >= 1, the last one the root) and the N nodes in one pass at
rows start .. start+P+N-1; a node at depth j has the position of row start+P-1+j (the row it will
have once accepted) and sees the prefix, the pending tokens and its ancestors (`layout`).

Greedy acceptance (`accept_greedy_tree`): from the root, follow the child whose token is the
target's argmax at the current node; stop where none is; the argmax there is the bonus token.
Each accepted token is the target's own choice after the accepted prefix, so the output is plain
greedy decoding's token for token. The accepted nodes' cache rows are then moved to the rows a
chain would have written (`path_rows`), so the caches stay contiguous and rollback stays a
smaller `start`.

Sampling keeps chains: the tree is verified only by the greedy rule (speculative sampling over
siblings, by recursive rejection, is not implemented here).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.config import ConfigError


@dataclass(frozen=True)
class TreeShape:
    """At most `nodes` drafted tokens, at most `depth` deep, `topk` children per expanded node."""
    nodes: int
    depth: int
    topk: int

    def __post_init__(self):
        for name in ("nodes", "depth", "topk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"tree {name}={v!r} is not allowed; it must be an integer >= 1")
        if self.depth > self.nodes:
            raise ConfigError(f"tree depth={self.depth} > nodes={self.nodes}: a tree of {self.nodes} "
                              f"nodes is at most {self.nodes} deep")

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        """'N,d,K' (nodes, depth, top-K) -> TreeShape."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            if not all(p.isascii() and p.isdigit() for p in parts):   # int() also reads other scripts' digits
                raise ValueError(text)
            n, d, k = (int(p) for p in parts)
        except ValueError:
            raise ConfigError(f"tree {text!r}: expected N,d,K (nodes, depth, top-K), e.g. 16,6,4; allowed: "
                              "three whole numbers in ASCII digits") from None
        return cls(n, d, k)

    def __str__(self) -> str:
        return f"{self.nodes},{self.depth},{self.topk}"

    def check_width(self, max_width: int, pending: int = 1) -> None:
        """The verify pass of this tree (pending + nodes) must fit the backend's widest one."""
        if pending + self.nodes > max_width:
            raise ConfigError(f"tree nodes={self.nodes}: a verify pass of {pending + self.nodes} tokens is wider "
                              f"than this backend takes ({max_width}); allowed nodes <= {max_width - pending}")


@dataclass
class Tree:
    """A drafted tree, nodes in breadth-first order (a parent before its children).

    tokens (N,) int64; parents (N,) int64 (-1: a child of the root); depths (N,) >= 1;
    draft_rows (N,) the draft cache row the node was fed at (-1: never fed to the draft)."""
    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    draft_rows: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def path(self, node: int) -> list[int]:
        """Nodes from depth 1 down to `node`."""
        out = []
        while node >= 0:
            out.append(int(node))
            node = int(self.parents[node])
        return out[::-1]


def layout(tree: Tree, pending: int) -> tuple[np.ndarray, np.ndarray]:
    """The verify pass of `pending` tokens then the tree's nodes -> (offsets (w,), mask (w, w) bool).

    offsets: position of each row relative to `start` (pending i: i; a node at depth j:
    pending - 1 + j); mask[i, j]: row i sees row j (pending rows causally; a node: every pending
    row, its ancestors and itself)."""
    n, w = len(tree), pending + len(tree)
    offsets = np.concatenate([np.arange(pending), pending - 1 + tree.depths]).astype(np.int64)
    mask = np.zeros((w, w), bool)
    mask[:pending, :pending] = np.tril(np.ones((pending, pending), bool))
    mask[pending:, :pending] = True
    for i in range(n):
        mask[pending + i, pending + i] = True
        p = int(tree.parents[i])
        if p >= 0:      # parents come first (breadth-first), so their rows are complete
            mask[pending + i] |= mask[pending + p]
    return offsets, mask


def chain_tree(tokens, draft_rows=None) -> Tree:
    """A chain as a tree (node i the child of node i-1): what a tree of top-K 1 is."""
    n = len(tokens)
    rows = np.full(n, -1, np.int64) if draft_rows is None else np.asarray(draft_rows, np.int64)
    return Tree(np.asarray(tokens, np.int64), np.arange(-1, n - 1, dtype=np.int64),
                np.arange(1, n + 1, dtype=np.int64), rows)


def accept_greedy_tree(tree: Tree, argmax: np.ndarray) -> tuple[list[int], int]:
    """argmax (1 + N,): the target's choice at the root (the last pending row), then at each node
    -> (accepted nodes from depth 1, the bonus token: the target's choice after the last one)."""
    children: dict[int, dict[int, int]] = {}
    for i in range(len(tree)):
        children.setdefault(int(tree.parents[i]), {}).setdefault(int(tree.tokens[i]), i)
    path, node = [], -1
    while True:
        t = int(argmax[node + 1])
        nxt = children.get(node, {}).get(t)
        if nxt is None:
            return path, t
        path.append(nxt)
        node = nxt


def greedy_run(tree: Tree, path: list[int]) -> tuple[int, int]:
    """(L, n): the draft's greedy line in the tree (from the root, each node's first child: its
    most likely, nodes being ordered by score within a depth) is L deep, and the accepted path
    follows it for its first n nodes. That is what a chain of k = L greedy drafts, the tokens of
    that line, would have had accepted at this step: rejected at token n + 1 where n < L, all L
    accepted where n = L. A tree step thus measures the chain it competes with."""
    first: dict[int, int] = {}
    for i in range(len(tree)):
        first.setdefault(int(tree.parents[i]), i)
    line, node = [], -1
    while node in first:
        node = first[node]
        line.append(node)
    n = 0
    while n < min(len(line), len(path)) and path[n] == line[n]:
        n += 1
    return len(line), n


def select(scores: np.ndarray, depths: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n best candidates by score (higher first; ties: the shallower, then the
    earlier). A child's score is its parent's plus a log-probability (<= 0) and it is deeper, so
    a kept child's parent is kept."""
    order = np.lexsort((np.arange(len(scores)), depths, -scores))
    return order[:n]


class TreeBuilder:
    """The host side of drafting a tree (module docstring): the backend feeds the draft and reads
    each fed node's top-K (ids, log-probabilities); this keeps the candidates and picks.

        b = TreeBuilder(shape)
        b.root(ids, logp)                      the root's top-K
        while (nodes := b.expand()) is not None:     nodes to feed: candidate indices
            ... feed them (parents' rows: b.row_of) ...
            b.children(nodes, rows, ids, logp)       their top-K each, the rows they were fed at
        tree = b.tree()
    """

    def __init__(self, shape: TreeShape, expand: int | None = None):
        self.shape = shape
        self.width = shape.topk if expand is None else int(expand)   # candidates fed per depth
        self.tokens, self.parents, self.depths, self.scores, self.rows = [], [], [], [], []
        self.frontier: list[int] = []

    def _add(self, parent: int, depth: int, base: float, ids, logp) -> list[int]:
        out = []
        for t, lp in zip(np.asarray(ids).tolist(), np.asarray(logp, np.float64).tolist()):
            if not np.isfinite(lp):
                continue            # a masked token is never a candidate
            out.append(len(self.tokens))
            self.tokens.append(int(t)), self.parents.append(parent), self.depths.append(depth)
            self.scores.append(base + lp), self.rows.append(-1)
        return out

    def root(self, ids, logp) -> None:
        self.frontier = self._add(-1, 1, 0.0, ids, logp)

    def expand(self) -> list[int] | None:
        """The candidates to feed next (the K best of the deepest depth; `expand` of them when
        given: 1 on a backend whose draft graphs take no tree mask), or None: done."""
        if not self.frontier or self.depths[self.frontier[0]] >= self.shape.depth:
            return None
        f = np.asarray(self.frontier)
        best = select(np.asarray(self.scores)[f], np.asarray(self.depths)[f], self.width)
        return [int(i) for i in f[np.sort(best)]]

    def children(self, nodes: list[int], rows, ids, logp) -> None:
        """nodes were fed at draft rows `rows`; ids, logp (len(nodes), K) their top-K children."""
        new = []
        for node, row, i, lp in zip(nodes, rows, ids, logp):
            self.rows[node] = int(row)
            new += self._add(node, self.depths[node] + 1, self.scores[node], i, lp)
        self.frontier = new

    def row_of(self, node: int) -> int:
        return self.rows[node]

    def tree(self) -> Tree:
        """The N best candidates, breadth-first (by depth, then score), parents re-indexed."""
        scores, depths = np.asarray(self.scores), np.asarray(self.depths, np.int64)
        keep = select(scores, depths, self.shape.nodes)
        keep = keep[np.lexsort((keep, -scores[keep], depths[keep]))]
        self.kept = keep
        index = {int(c): i for i, c in enumerate(keep)}
        parents = np.array([index[self.parents[c]] if self.parents[c] >= 0 else -1 for c in keep], np.int64)
        return Tree(np.array([self.tokens[c] for c in keep], np.int64), parents, depths[keep],
                    np.array([self.rows[c] for c in keep], np.int64))


def path_rows(tree: Tree, path: list[int], pending: int, start: int) -> np.ndarray:
    """Target cache rows of the accepted nodes, in path order (to be moved to start+pending+j)."""
    return start + pending + np.asarray(path, np.int64)


def fed_prefix(tree: Tree, path: list[int]) -> list[int]:
    """The draft rows of the leading accepted nodes that were fed to the draft (an expanded
    node's ancestors were all expanded, so these are a prefix of the path)."""
    rows = []
    for node in path:
        if tree.draft_rows[node] < 0:
            break
        rows.append(int(tree.draft_rows[node]))
    return rows
