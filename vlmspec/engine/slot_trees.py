"""Every row's real slots of its padded draft levels (`level_step.Slots`) gathered into a tree of its own nodes: the
host lays out, from the one read of which slots are real, each node's slot, depth and parent rule in one copy
(`slot_trees`); the gathers themselves are one function of tensors (`gather_nodes`), one compiled region where the
pair runs compiled (`GATHER_NODES`)."""

from __future__ import annotations

import bisect

import torch

from ..device_tensors import host_values
from .compiled import Captured, GuardedRunner
from .level_step import Slots
from .tree import Trees, with_edges


def slot_trees(
    runner: GuardedRunner, slots: Slots, top_k: int, real: list[list[int]], level_ends: list[int]
) -> tuple[Trees, torch.Tensor, torch.Tensor, list[int]]:
    """Each row's `real` slots of its padded levels gathered into a tree of its own nodes (per-row structure, padded
    to the largest, the padding invalid), its ancestor rows as the target's verification sees them (`with_edges`,
    (B, n, n + 2)), how deep each row's draft top-1 path reaches in it (B,), and each row's tree depth (host). A
    slot's parent is the frontier slot its candidate index (`slots.candidates`: frontier slot times `top_k` plus
    rank) names, in the level before its own (`level_ends`: where each level ends). The gathers
    run through `runner`'s captured form."""
    rows, n, width = len(real), max(len(row) for row in real), slots.tokens.shape[1]
    remap = [[0] * width for _ in real]
    depths, starts, fixed, tree_depths = [], [], [], []
    for b, row in enumerate(real):
        for node, slot in enumerate(row):
            remap[b][slot] = node
            depth = bisect.bisect_right(level_ends, slot)
            depths.append(depth)
            starts.append(level_ends[depth - 2] if depth > 1 else 0)
            fixed.append(-1 if node == 0 else -2)  # the root has no parent; real nodes take theirs
        tree_depths.append(depth)  # slots ascend, so the last is the deepest
        pad = range(len(row), n)
        depths.extend(0 for _ in pad)
        starts.extend(0 for _ in pad)
        fixed.extend(pad)  # padding is its own parent
    padded = [v for row in real for v in row + [0] * (n - len(row))]
    flat = padded + [v for row in remap for v in row] + depths + starts + fixed + [len(row) for row in real]
    written = host_values(flat, slots.tokens.device)
    layout = (written[: rows * n].view(rows, n), written[rows * n : rows * (n + width)].view(rows, width))
    layout += (written[rows * (n + width) : rows * (4 * n + width)].view(3, rows, n), written[rows * (4 * n + width) :])
    tensors = (slots.tokens, slots.log_probs, slots.candidates, slots.ancestors)
    *fields, visible, greedy_depth, measured = GATHER_NODES(runner, *tensors, *layout, top_k, slots.statistics)
    trees = Trees(*fields[:5], max(tree_depths), fields[5], measured)
    return trees, visible, greedy_depth, tree_depths


def gather_nodes(
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    candidates: torch.Tensor,
    ancestors: torch.Tensor,
    index: torch.Tensor,
    new_index: torch.Tensor,
    node_layout: torch.Tensor,
    sizes: torch.Tensor,
    top_k: int,
    statistics: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """The trees' node tensors from the slots' `tokens`, `log_probs`, `candidates` (B, C) and `ancestors` (B, C, C):
    each node's slot (`index`, (B, n)), each slot's node (`new_index`, (B, C)), each node's depth, its level's first
    slot and its parent rule (`node_layout`, (3, B, n): -1 the root, -2 a real node's own parent, else padding's own
    index) and each row's real nodes (`sizes`, (B,)). Returns tokens, path log-probabilities (-inf past the real
    nodes), parents, depths, ancestor rows (B, n, n) and which nodes are real, then the ancestor rows with their
    edges (`with_edges`), how deep each row's draft top-1 path reaches (B,) and each node's measured `statistics`
    (B, n, s; None where the slots carry none)."""
    n = index.shape[1]
    node_depths, node_starts, node_fixed = node_layout[0], node_layout[1], node_layout[2]
    is_real = torch.arange(n, device=index.device)[None] < sizes[:, None]
    node_candidates = candidates.gather(1, index)
    parents = new_index.gather(1, node_candidates // top_k + node_starts)
    node_parents = torch.where(node_fixed >= -1, node_fixed, parents)
    by_row = ancestors.gather(1, index[:, :, None].expand(-1, -1, ancestors.shape[2]))
    node_ancestors = by_row.gather(2, index[:, None, :].expand(-1, n, -1))
    node_ancestors = node_ancestors & is_real[:, :, None] & is_real[:, None, :]
    off_path = node_ancestors & (node_candidates % top_k != 0)[:, None, :]
    node_log_probs = log_probs.gather(1, index).masked_fill(~is_real, -torch.inf)
    greedy_depth = (node_depths * ~off_path.any(dim=2) * is_real).amax(dim=1)
    fields = (tokens.gather(1, index), node_log_probs, node_parents, node_depths, node_ancestors, is_real)
    measured = None
    if statistics is not None:
        measured = statistics.gather(1, index[:, :, None].expand(-1, -1, statistics.shape[2]))
    return *fields, with_edges(node_ancestors), greedy_depth, measured


GATHER_NODES = Captured(gather_nodes, "tree gather")
