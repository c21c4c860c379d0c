"""One level of a tree whose shape every row shares (`grow.draft_rows`: a chain, a static tree), on tensors only: each
frontier node's children are the ranks of its draft top-k the shape names, written as views where the shape keeps
every frontier node's first ranks. A level is one function of its inputs (`shape_level`, or `scored_shape_level`
from the draft's logits where every row shares its processing, `DraftScoring`), and so is the root (`shape_root`):
each one compiled region where the pair runs compiled (`SHAPE_LEVEL`, `SCORED_SHAPE_LEVEL`, `SHAPE_ROOT`)."""

from __future__ import annotations

import torch

from ..policies import NodeMeasure
from .compiled import Captured
from .draft import DraftScoring, root_of
from .tree import TreeShape


def shape_root(
    logits: torch.Tensor,
    pending: torch.Tensor,
    last: torch.Tensor,
    start: torch.Tensor,
    n: int,
    scoring: DraftScoring | None,
    measured: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """From the draft's `logits` (B, P, V) over each row's `pending` tokens (B, P), the last real one (`last`, (B,))
    its root: the root's logits (B, 1, V), or under `scoring` (where every row shares it) its proposal
    log-probabilities and their ranking key (`root_of`); the roots' positions (`start` (B,) plus `last`); the `n`
    nodes' tokens and path log-probabilities (B, n), the root's written (its path log-probability 0); and, with
    `measured` values a node (`NodeMeasure.width`), their tensor (B, n, measured), NaN until a level writes them."""
    rows = logits.shape[0]
    root, root_scores, root_order = root_of(logits, pending, last, scoring)
    tokens = torch.empty(rows, n, dtype=torch.long, device=logits.device)
    tokens[:, 0] = root
    statistics = torch.full((rows, n, measured), torch.nan, device=logits.device) if measured else None
    return root_scores, root_order, start + last, tokens, torch.zeros(rows, n, device=logits.device), statistics


def shape_level(
    shape: TreeShape,
    level: int,
    top_k: int,
    child_log_probs: torch.Tensor,
    child_order: torch.Tensor,
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    measured: tuple[NodeMeasure, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Write `level` of every row's tree of `shape` into its `tokens` and path `log_probs` (B, N): each frontier
    node's children are the ranks of its draft top-k the shape names, from the frontier's log-probabilities and
    ranking key `child_log_probs`, `child_order` (B, F, V); with `measured` (a `NodeMeasure` and the nodes' values
    (B, N, s)) the frontier's values are written too. Returns the level's tokens (B, n) as the level's draft forward
    takes them: compiled, contiguous (a compiled forward's graph expects those strides); eager, a view."""
    rows = tokens.shape[0]
    frontier, new = shape.level(level - 1), shape.level(level)
    top = child_order.topk(top_k, dim=-1)
    # Ranked by the log-probabilities themselves (no warpers), the top values are theirs.
    top_log_probs = top.values if child_order is child_log_probs else child_log_probs.gather(-1, top.indices)
    if measured is not None:
        measured[1][:, frontier] = measured[0].measure(child_log_probs, top_log_probs)
    count = shape.full[level - 1]
    if count is not None:  # every frontier node's first `count` ranks, in order: views, no gather
        level_tokens = tokens[:, new].view(rows, -1, count)
        level_tokens.copy_(top.indices[:, :, :count])
        picked, level_log_probs = top_log_probs[:, :, :count], log_probs[:, new].view(rows, -1, count)
        parents = log_probs[:, frontier, None]
    else:
        parent_rows, ranks = shape.children[level - 1]
        tokens[:, new] = top.indices[:, parent_rows, ranks]
        picked, level_log_probs = top_log_probs[:, parent_rows, ranks], log_probs[:, new]
        parents = log_probs[:, frontier][:, parent_rows]
    # The root's path log-probability is 0.
    level_log_probs.copy_(picked if level == 1 else parents + picked)
    level_tokens = tokens[:, new]
    return level_tokens.clone(memory_format=torch.contiguous_format) if torch.compiler.is_compiling() else level_tokens


def scored_shape_level(
    shape: TreeShape,
    level: int,
    top_k: int,
    logits: torch.Tensor,
    scoring: DraftScoring,
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    measured: tuple[NodeMeasure, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`shape_level` from the draft's `logits` (B, F, V) of the frontier, under the `scoring` every row shares: the
    frontier's proposal log-probabilities and ranking key are taken here, in the level's region."""
    frontier = shape.level(level - 1)
    ancestors = shape.ancestors[frontier, : frontier.stop]
    child_log_probs, order = scoring.log_probs(logits, tokens[:, : frontier.stop], ancestors, level - 1)
    child_order = child_log_probs if order is None else order
    return shape_level(shape, level, top_k, child_log_probs, child_order, tokens, log_probs, measured)


SHAPE_ROOT = Captured(shape_root, "shared root")
SHAPE_LEVEL = Captured(shape_level, "shared level")
SCORED_SHAPE_LEVEL = Captured(scored_shape_level, "scored shared level")
