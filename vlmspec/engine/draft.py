"""A grown draft tree, as one row holds it (`Drafted`) and as a step's rows hold theirs (`GrownTrees`, `root_trees`
for a step that drafts nothing), and the draft's proposal log-probabilities under a row's processing."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..device_tensors import zeros
from .processing import NodeProcessing
from .tree import Tree, Trees

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


def plain_log_probs(logits: torch.Tensor, vocab_limit: int) -> torch.Tensor:
    """The draft's log-probabilities (..., V') of the real tokens (below `vocab_limit`) from its `logits` (..., V),
    where no processing applies: also their ranking key."""
    return torch.log_softmax(logits[..., :vocab_limit].float(), dim=-1)


@dataclass
class DraftScoring:
    """How a draft level's compiled region turns the draft's logits into proposal log-probabilities and their ranking
    key, where every row shares it: the real tokens (below `vocab_limit`), the config's `processing` (None: none; else
    one whose sequence processors read a sequence as a set of ids) over the rows' tokens so far `sequences` (B, T)
    (None where nothing reads them)."""

    vocab_limit: int
    processing: NodeProcessing | None = None
    sequences: torch.Tensor | None = None

    def log_probs(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor | None = None,
        ancestors: torch.Tensor | None = None,
        depth: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The proposal log-probabilities (B, m, V') of the draft's `logits` (B, m, V) of nodes `depth` deep whose
        ancestor rows over the trees' `tokens` (B, N) are `ancestors` (m, N) or (B, m, N) (None: the roots), and their
        ranking key, None where it is the log-probabilities themselves (no warpers)."""
        made = (self.processing, self.vocab_limit, self.sequences, tokens, ancestors, depth)
        log_probs, order = proposal_log_probs(logits, *made)
        return log_probs, None if order is log_probs else order


def root_of(
    logits: torch.Tensor, pending: torch.Tensor, last: torch.Tensor, scoring: DraftScoring | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each row's root, the last real one (`last`, (B,)) of its `pending` tokens (B, P), and the draft's logits after
    it (B, 1, V) from its `logits` (B, P, V), or under `scoring` its proposal log-probabilities and their ranking key
    (`DraftScoring.log_probs`; without `scoring` the key is None)."""
    rows = logits.shape[0]
    root_logits = logits.gather(1, last[:, None, None].expand(rows, 1, logits.shape[2]))
    root = pending.gather(1, last[:, None])[:, 0]
    if scoring is None:
        return root, root_logits, None
    return root, *scoring.log_probs(root_logits)


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
    if processing is None:
        log_probs = plain_log_probs(logits, vocab_limit)
        return log_probs, log_probs
    if logits.shape[-1] > vocab_limit:
        logits = logits[..., :vocab_limit]
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


@dataclass
class GrownTrees:
    """Every row's tree of a step, the draft's root log-probabilities (B, V), how many levels of each row's tree the
    draft cache holds, each row's greedy depth (B,) and valid nodes (`sizes`, host), the draft forwards and tokens
    fed (padding included), and each row's map from node to the slot the draft was fed it at when its levels were
    padded (`slots`; None, or None for a row, where nodes and slots coincide). `visible`, where the growth made it,
    is the trees' ancestor rows as the target's verification takes them (`with_edges`, (B, N, N + 2))."""

    trees: Trees
    root_log_probs: torch.Tensor
    cached_depths: list[int]
    greedy_depth: torch.Tensor
    sizes: list[int]
    depths: list[int]
    forwards: int
    fed_tokens: int
    slots: Sequence[list[int] | None] | None = None
    visible: torch.Tensor | None = None

    def row(self, b: int) -> Drafted:
        """Row `b`'s tree cut to its valid nodes (views)."""
        tree = self.trees.row(b, self.sizes[b], self.depths[b])
        slots = None if self.slots is None else self.slots[b]
        return Drafted(
            tree,
            self.root_log_probs[b],
            self.cached_depths[b],
            self.greedy_depth[b],
            self.forwards,
            self.fed_tokens,
            slots,
        )

    @staticmethod
    def one(grown: Drafted) -> GrownTrees:
        """One tree as a batch of one (views)."""
        return GrownTrees(
            grown.tree.rows(),
            grown.root_log_probs[None],
            [grown.cached_depth],
            grown.greedy_depth[None],
            [grown.tree.size],
            [grown.tree.depth],
            grown.forwards,
            grown.fed_tokens,
        )


def root_trees(roots: torch.Tensor) -> GrownTrees:
    """A step that drafts nothing, as trees of their root alone: every row's last token `roots` (B,), which the
    target's forward turns into its next token as `generate`'s step does. No draft forward ran (the draft catches up
    on the tokens it missed when it next drafts)."""
    device, rows = roots.device, roots.shape[0]
    nothing, no_log_probs = zeros(rows, device), zeros(rows, device, torch.float32)[:, None]
    parents, ancestors = _root_structure(device)
    trees = Trees(roots[:, None], no_log_probs, parents, nothing[:1], ancestors, 0)
    return GrownTrees(trees, no_log_probs, [0] * rows, nothing, [1] * rows, [0] * rows, 0, 0)


@functools.cache
def _root_structure(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-node tree's parents ([-1]) and ancestors ([[True]]) on `device`, made once."""
    return torch.full((1,), -1, dtype=torch.long, device=device), torch.ones(1, 1, dtype=torch.bool, device=device)
