"""A draft tree held as tensors: tokens, parents, depths, cumulative log-probabilities and ancestor mask.

Node 0 is the root: the last emitted token, already chosen but not yet in the target's cache. Nodes are stored
level by level, so a node's index is larger than its parent's and every root-to-node path is in ascending order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, prefix_len: int = 0) -> torch.Tensor:
    """An additive mask `(1, 1, q, prefix_len + k)`: each row sees the prefix and its `visible` (q, k) keys.

    With no prefix it is the block form the tree attention takes: it covers the last k keys, all before are seen.
    """
    q, k = visible.shape
    if prefix_len == 0:
        return torch.full((1, 1, q, k), torch.finfo(dtype).min, dtype=dtype, device=visible.device).masked_fill_(
            visible, 0.0
        )
    bias = torch.zeros((1, 1, q, prefix_len + k), dtype=dtype, device=visible.device)
    bias[0, 0, :, prefix_len:].masked_fill_(visible.logical_not(), torch.finfo(dtype).min)
    return bias


def with_edges(visible: torch.Tensor) -> torch.Tensor:
    """A (..., q, w) visibility block as `ModelRunner.forward_rows` takes it, (..., q, w + 2): column 0 stands for the
    keys before the block (seen), the last column for those after it (unseen), so one clamped index says what each
    key is. (A tree's ancestor rows over its slots 0..w + 1 already have this layout when slot 0, the root, is
    before the block and slot w + 1 is not yet grown.)"""
    edge = visible.shape[:-1] + (1,)
    return torch.cat([visible.new_ones(edge), visible, visible.new_zeros(edge)], dim=-1)


@dataclass
class Tree:
    """An immutable view of a grown tree; `ancestors[i, j]` is True when j is i or one of i's ancestors.

    `depth` is the depth of the deepest node (0 for a root-only tree), known on the host as the tree grows.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    log_probs: torch.Tensor
    ancestors: torch.Tensor
    depth: int

    @property
    def size(self) -> int:
        """Number of nodes including the root."""
        return self.tokens.shape[0]

    def to(self, device: torch.device) -> Tree:
        """The same tree on `device` (the target may sit on another device than the draft)."""
        if self.tokens.device == device:
            return self
        tensors = (self.tokens, self.parents, self.depths, self.log_probs, self.ancestors)
        return Tree(*(t.to(device) for t in tensors), self.depth)

    def path_to(self, node: int) -> torch.Tensor:
        """Node indices from the root to `node`, both included, in root-to-leaf order."""
        return self.ancestors[node].nonzero().squeeze(1)

    def attention_bias(self, dtype: torch.dtype, prefix_len: int = 0) -> torch.Tensor:
        """Additive mask `(1, 1, n, prefix_len + n)`: each node sees the whole prefix, its ancestors and itself
        (without `prefix_len`, the block over the nodes' own keys that the tree attention takes)."""
        return additive_mask(self.ancestors, dtype, prefix_len)

    def rows(self) -> Trees:
        """The tree as a batch of one (views, no copy)."""
        return Trees(self.tokens[None], self.log_probs[None], self.parents, self.depths, self.ancestors, self.depth)

    def leaf_paths(self) -> list[list[int]]:
        """Every root-to-leaf path as lists of node indices (for inspection and tests, not the hot path)."""
        has_child = torch.zeros(self.size, dtype=torch.bool, device=self.tokens.device)
        has_child[self.parents[1:]] = True
        return [self.path_to(int(i)).tolist() for i in (~has_child).nonzero().squeeze(1)]


@dataclass
class Trees:
    """Every row's tree of one step as `(B, N)` tensors.

    The rows' trees share one structure, `parents`, `depths` (N,) and `ancestors` (N, N), or each has its own,
    (B, N) and (B, N, N): trees of different shapes padded to N nodes, where a padding node is its own parent and
    has no ancestors. They differ in `tokens` and cumulative draft `log_probs` (B, N). `valid` (B, N), when given,
    marks the nodes a row may accept (a row near its token budget drafts the same levels as the others, its deeper
    nodes invalid; padding is invalid). `depth` is the deepest node's depth. `node_statistics` (B, N, s), where the
    rows' plans measure their nodes (`NodeMeasure`), holds each node's values (NaN for a node never expanded);
    `confidence` (B, N), where a row verifies relaxed, the draft's mixed confidence at each node (NaN alike).
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ancestors: torch.Tensor
    depth: int
    valid: torch.Tensor | None = None
    node_statistics: torch.Tensor | None = None
    confidence: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Nodes per row, the root included."""
        return self.tokens.shape[1]

    def row_parents(self) -> torch.Tensor:
        """Every row's parents (B, N) (a view when the rows share them)."""
        return self.parents if self.parents.ndim == 2 else self.parents[None].expand(self.tokens.shape[0], -1)

    def row_depths(self) -> torch.Tensor:
        """Every row's depths (B, N) (a view when the rows share them)."""
        return self.depths if self.depths.ndim == 2 else self.depths[None].expand(self.tokens.shape[0], -1)

    def row_ancestors(self) -> torch.Tensor:
        """Every row's ancestors (B, N, N) (a view when the rows share them)."""
        if self.ancestors.ndim == 3:
            return self.ancestors
        return self.ancestors[None].expand(self.tokens.shape[0], -1, -1)

    def to(self, device: torch.device) -> Trees:
        """The same trees on `device` (the target may sit on another device than the draft)."""
        if self.tokens.device == device:
            return self
        optional = (self.valid, self.node_statistics, self.confidence)
        valid, measured, confidence = (None if t is None else t.to(device) for t in optional)
        tensors = (self.tokens, self.log_probs, self.parents, self.depths, self.ancestors)
        return Trees(*(t.to(device) for t in tensors), self.depth, valid, measured, confidence)

    def row(self, b: int, nodes: int | None = None, depth: int | None = None) -> Tree:
        """Row `b`'s tree (views, no copy): all its nodes, invalid ones included, or its first `nodes` (the levels up
        to `depth`)."""
        n = self.size if nodes is None else nodes
        return Tree(
            self.tokens[b, :n],
            self.row_parents()[b, :n],
            self.row_depths()[b, :n],
            self.log_probs[b, :n],
            self.row_ancestors()[b, :n, :n],
            self.depth if depth is None else depth,
        )


@dataclass
class TreeShape:
    """The structure a fixed tree of rank paths gives every row's tree: node i's parent, depth, ancestors and draft
    rank, and per level the new nodes as (frontier row, rank) pairs over the level above; `full[l - 1]` is c when
    level l gives every frontier node its ranks 0..c-1 (a chain's levels; its children are then a view of the top-c),
    else None. Nodes are in the order the growth keeps them: level by level, each level by parent, then rank.
    `blocks` keeps what steps derive from the structure alone (visibility blocks, greedy depths), made once."""

    parents: torch.Tensor
    depths: torch.Tensor
    ancestors: torch.Tensor
    ranks: torch.Tensor
    level_ends: list[int]
    children: list[tuple[torch.Tensor, torch.Tensor]]
    full: list[int | None]
    blocks: dict[tuple, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.parents.shape[0]

    @property
    def depth(self) -> int:
        return len(self.level_ends) - 1

    def level(self, level: int) -> slice:
        """The nodes of `level` (0 is the root)."""
        return slice(self.level_ends[level - 1] if level else 0, self.level_ends[level])

    @property
    def greedy_path(self) -> torch.Tensor:
        """(N,): each node's depth where its whole path is the draft's rank-0 choices, else 0."""
        return self.depths * ~(self.ancestors & (self.ranks != 0)[None, :]).any(dim=1)

    def greedy_depth(self, n: int, rows: int) -> torch.Tensor:
        """How far the draft's own top-1 path reaches in the tree's first `n` nodes, for each of `rows` rows (rows,),
        contiguous, on the device (made once per `n` and `rows`)."""
        key = ("greedy", n, rows)
        depth = self.blocks.get(key)
        if depth is None:
            depth = self.blocks[key] = self.greedy_path[:n].amax().expand(rows).clone()
        return depth

    def prefix_ancestors(self, n: int) -> torch.Tensor:
        """The first `n` nodes' ancestor mask (n, n), contiguous (made once): a slice of the whole tree's would carry
        its strides, and a compiled step's graph would compile again for each `n` a budget cuts the tree to."""
        key = ("ancestors", n)
        ancestors = self.blocks.get(key)
        if ancestors is None:
            ancestors = self.blocks[key] = self.ancestors[:n, :n].clone(memory_format=torch.contiguous_format)
        return ancestors

    def block(self, rows: slice, columns: slice, count: int) -> torch.Tensor:
        """`with_edges(ancestors[rows, columns])` for each of `count` batch rows (count, q, w + 2), contiguous, as
        batched forwards take it (a compiled one's graph expects those strides), made once per tree and count."""
        key = (rows.start, rows.stop, columns.start, columns.stop, count)
        block = self.blocks.get(key)
        if block is None:
            block = with_edges(self.ancestors[rows, columns])
            block = self.blocks[key] = block.expand(count, -1, -1).clone(memory_format=torch.contiguous_format)
        return block


_SHAPES: dict[tuple[tuple[tuple[int, ...], ...], torch.device], TreeShape] = {}


def rank_tree_shape(paths: Sequence[Sequence[int]], device: torch.device) -> TreeShape:
    """The `TreeShape` of the tree whose nodes below the root are the rank `paths` (made once per tree and device)."""
    key = (tuple(sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))), torch.device(device))
    shape = _SHAPES.get(key)
    if shape is not None:
        return shape
    nodes: list[tuple[int, ...]] = [(), *key[0]]
    index = {path: i for i, path in enumerate(nodes)}
    parents = [-1] + [index[p[:-1]] for p in nodes[1:]]
    ancestors = torch.eye(len(nodes), dtype=torch.bool)
    for i in range(1, len(nodes)):
        ancestors[i] |= ancestors[parents[i]]
    level_ends = [sum(len(p) <= d for p in nodes) for d in range(max(len(p) for p in nodes) + 1)]
    children, full = [], []
    for level in range(1, len(level_ends)):
        first = level_ends[level - 2] if level > 1 else 0
        members = nodes[level_ends[level - 1] : level_ends[level]]
        rows = [index[p[:-1]] - first for p in members]
        ranks = [p[-1] for p in members]
        frontier = level_ends[level - 1] - first
        count = len(members) // frontier
        every = len(members) == frontier * count and ranks == list(range(count)) * frontier
        full.append(count if every else None)
        children.append((torch.tensor(rows, device=device), torch.tensor(ranks, device=device)))
    shape = _SHAPES[key] = TreeShape(
        parents=torch.tensor(parents, device=device),
        depths=torch.tensor([len(p) for p in nodes], device=device),
        ancestors=ancestors.to(device),
        ranks=torch.tensor([p[-1] if p else 0 for p in nodes], device=device),
        level_ends=level_ends,
        children=children,
        full=full,
    )
    return shape
