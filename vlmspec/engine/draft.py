"""A grown draft tree as one row holds it, and the draft's proposal log-probabilities under a row's processing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .choice import NodeProcessing
from .tree import Tree

# Log-probabilities are ranked above this floor; tokens the warpers cut are ranked below it, by processed order.
_RANK_FLOOR = 1e4


@dataclass
class Drafted:
    """A grown tree, the draft's log-probabilities at the root, and how many of its levels the draft cache holds.

    The log-probabilities are under the generation config's processing, warpers included when the target samples
    (-inf for the tokens they cut).

    `greedy_depth` (on the device) is how far the draft's own top-1 path reaches in the tree: with the target as its
    own draft, exactly that many tokens are accepted. `forwards` and `fed_tokens` count the draft forwards and their
    tokens. When a masked plan padded the levels, `slots` (host) maps each tree node to its slot among the tokens
    the draft was fed (its cache position after the pending tokens); None when they coincide.
    """

    tree: Tree
    root_log_probs: torch.Tensor
    cached_depth: int
    greedy_depth: torch.Tensor
    forwards: int
    fed_tokens: int
    slots: list[int] | None = None


def sequence_proposal_log_probs(
    logits: torch.Tensor,
    processing: NodeProcessing | None,
    vocab_limit: int,
    sequence: torch.Tensor,
    tokens: torch.Tensor | None = None,
    ancestors: torch.Tensor | None = None,
    depth: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`proposal_log_probs` of one sequence's nodes: draft `logits` (m, V) or the root's (V,), `sequence` (1, T),
    the tree's `tokens` (N,)."""
    rows_tokens = None if tokens is None else tokens[None]
    flat = logits.reshape(1, -1, logits.shape[-1])
    log_probs, order = proposal_log_probs(flat, processing, vocab_limit, sequence, rows_tokens, ancestors, depth)
    return log_probs.reshape(*logits.shape[:-1], -1), order.reshape(*logits.shape[:-1], -1)


def proposal_log_probs(
    logits: torch.Tensor,
    processing: NodeProcessing | None,
    vocab_limit: int,
    sequences: torch.Tensor | Sequence[torch.Tensor],
    tokens: torch.Tensor | None = None,
    ancestors: torch.Tensor | None = None,
    depth: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities (B, m, V') of the real tokens (below `vocab_limit`) under the generation config's processing,
    and their ranking key, for draft `logits` (B, m, V) of B sequences (`sequences` (B, T), or B tensors (1, T_b) of
    their own lengths, see `NodeProcessing.process_rows`).

    `ancestors` (m, N) are the nodes' ancestor rows over the trees' `tokens` (B, N) (None: the roots), `depth`
    theirs when all are equally deep (a level's nodes; None: not known). Tokens the
    warpers cut (top-k, top-p, ...) get -inf but keep their processed order behind the survivors, so a plan that asks
    for more children than survive still gets the draft's next best guesses.
    """
    if logits.shape[-1] > vocab_limit:
        logits = logits[..., :vocab_limit]
    if processing is None:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return log_probs, log_probs
    here = sequences.device if isinstance(sequences, torch.Tensor) else sequences[0].device
    if logits.device != here:
        # A draft on another device than the target: the config's processors were built on the target's device,
        # where the sequences are kept, so the draft's logits are processed there.
        moved = [None if t is None else t.to(here) for t in (tokens, ancestors)]
        log_probs, order = proposal_log_probs(logits.to(here), processing, vocab_limit, sequences, *moved, depth)
        return log_probs.to(logits.device), order.to(logits.device)
    width = logits.shape[-1]
    widened = processing.width is not None and processing.width > width
    if widened:
        logits = torch.nn.functional.pad(logits, (0, processing.width - width), value=-torch.inf)
    scores = processing.process_rows(logits, sequences, tokens, ancestors, depth)
    if widened:
        scores = scores[..., :width]
    ranked = torch.log_softmax(scores, dim=-1)
    if not processing.warpers:
        return ranked, ranked
    first = sequences[:1] if isinstance(sequences, torch.Tensor) else sequences[0]
    log_probs = processing.log_probs(scores.flatten(0, 1), first).view_as(scores)
    cut = ranked.clamp_min(-_RANK_FLOOR) - 2 * _RANK_FLOOR
    return log_probs, torch.where(log_probs > -torch.inf, log_probs.clamp_min(-_RANK_FLOOR), cut)
