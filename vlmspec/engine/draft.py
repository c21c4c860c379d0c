"""Grow a draft tree with the draft model: one draft forward per tree level over its KV cache."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch

from ..policies import TreePlan
from .choice import NodeProcessing
from .row_runner import RowForward, RowRunner
from .tree import DraftTree, TreeBuilder

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

    tree: DraftTree
    root_log_probs: torch.Tensor
    cached_depth: int
    greedy_depth: torch.Tensor
    forwards: int
    fed_tokens: int
    slots: list[int] | None = None


def proposal_log_probs(
    logits: torch.Tensor,
    processing: NodeProcessing | None,
    vocab_limit: int,
    sequence: torch.Tensor,
    tokens: torch.Tensor | None = None,
    ancestors: torch.Tensor | None = None,
    depth: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`proposal_log_probs_rows` of one sequence's nodes: draft `logits` (m, V) or the root's (V,), `sequence` (1, T),
    the tree's `tokens` (N,)."""
    rows_tokens = None if tokens is None else tokens[None]
    flat = logits.reshape(1, -1, logits.shape[-1])
    log_probs, order = proposal_log_probs_rows(flat, processing, vocab_limit, sequence, rows_tokens, ancestors, depth)
    return log_probs.reshape(*logits.shape[:-1], -1), order.reshape(*logits.shape[:-1], -1)


def proposal_log_probs_rows(
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
        log_probs, order = proposal_log_probs_rows(logits.to(here), processing, vocab_limit, sequences, *moved, depth)
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
class SlotsRead:
    """The last request of a padded tree's growth: which of its slots are real, `valid` (n,) on the device, to be read
    on the host and sent back as a list of bools (a batch reads every row's in one read)."""

    valid: torch.Tensor


class Drafter:
    """Feeds the pending tokens, then each tree level, to the draft; the plan picks children from its top-k.

    The draft proposes only ids below `vocab_limit` (real tokens of both models, not head padding). Emitted tokens
    the draft cannot embed (the target's padding rows) are fed as its last embedding row: that costs the draft's
    accuracy, never the output's exactness.
    """

    def __init__(self, runner: RowRunner, vocab_limit: int, input_limit: int):
        self.runner = runner
        self.vocab_limit = vocab_limit
        self.input_limit = input_limit
        self.builder = TreeBuilder(0, runner.device)

    def _log_probs(
        self,
        logits: torch.Tensor,
        processing: NodeProcessing | None,
        sequence: torch.Tensor,
        rows: torch.Tensor | None = None,
        depth: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`proposal_log_probs` of the nodes whose ancestor rows are `rows` (None: the root) in the tree growing,
        all `depth` deep."""
        tokens = None if rows is None else self.builder.tokens[: self.builder.size]
        return proposal_log_probs(logits, processing, self.vocab_limit, sequence, tokens, rows, depth)

    def _builder_for(self, slots: int, device: torch.device) -> TreeBuilder:
        """The tree builder for a tree of up to `slots` nodes below its root on `device`: the one kept, made anew when
        the tree outgrows it or it is on another device."""
        if slots + 1 > self.builder.capacity or self.builder.tokens.device != device:
            self.builder = TreeBuilder(max(slots, self.builder.capacity - 1), device)
        return self.builder

    def _add_level(
        self,
        plan: TreePlan,
        level: int,
        masked: bool,
        frontier: slice,
        child_log_probs: torch.Tensor,
        child_order: torch.Tensor,
        real_nodes: torch.Tensor,
    ) -> tuple[slice | None, torch.Tensor]:
        """Add `level` to the tree growing: the children `plan` selects among the top-k of each `frontier` node, from
        their log-probabilities and ranking key `child_log_probs`, `child_order` (F, V). Masked, the level has a fixed
        number of slots, the plan marking which are real within its node cap and the real nodes so far (`real_nodes`,
        () on the device). Returns the level's nodes (None: the plan selected none) and the real nodes so far."""
        builder = self.builder
        top = child_order.topk(plan.top_k, dim=-1).indices
        top_log_probs = child_log_probs.gather(-1, top)
        parent_log_probs = builder.log_probs[frontier]
        if masked:
            count = min((frontier.stop - frontier.start) * plan.max_children(level), plan.max_nodes)
            binds = builder.size - 1 + count > plan.max_nodes
            budget = plan.max_nodes - real_nodes if binds else None
            rows, ranks, valid = plan.slots(level, parent_log_probs, top_log_probs, budget, count)
            real_nodes = real_nodes + valid.sum()
        else:
            budget = plan.max_nodes - (builder.size - 1)
            rows, ranks = plan.children(level, parent_log_probs, top_log_probs, budget)
            valid = None
        if rows.shape[0] == 0:
            return None, real_nodes
        new = builder.add_level(
            rows + frontier.start,
            top[rows, ranks],
            (parent_log_probs[:, None] + top_log_probs)[rows, ranks],
            ranks,
            valid,
            structure=(rows, ranks),
        )
        return new, real_nodes

    def _level_forward(
        self, new: slice, level: int, root_index: int, processing: NodeProcessing | None, sequence: torch.Tensor
    ) -> Generator[RowForward, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Feed the nodes `new` of `level` to the draft: yields their forward, is sent its logits (q, V), and returns
        the nodes' children's proposal log-probabilities and ranking key (q, V)."""
        builder = self.builder
        visible = builder.ancestors[new, 1 : new.stop]
        logits = yield RowForward(builder.tokens[new], builder.depths[new], visible, root_index)
        return self._log_probs(
            logits,
            processing,
            sequence,
            None if processing is None else builder.ancestors[new, : builder.size],
            level,
        )

    def steps(
        self,
        pending: torch.Tensor,
        plan: TreePlan,
        sequence: torch.Tensor,
        length: int,
        processing: NodeProcessing | None = None,
        max_depth: int | None = None,
    ) -> Generator[RowForward | SlotsRead, torch.Tensor | list[bool], Drafted]:
        """Grow one row's tree as a generator: yields each draft forward it needs over a cache of `length` positions, is
        sent that forward's logits (q, V), and returns the tree; so many rows' trees grow through one batched forward.
        A padded tree yields a last `SlotsRead` and is sent its slots' host values, so many rows read theirs at once.

        `pending` are the emitted tokens the draft has not seen (the last one is the root); `sequence` (1, T) is
        everything emitted so far, ending with the root; `processing` the config's processors. The tree stops at
        `max_depth` levels (the tokens left in the budget, less the bonus token), if given."""
        masked = plan.masked if plan.masked is not None else self.runner.device.type != "cpu"
        depth = plan.levels(masked) if max_depth is None else max(0, min(plan.levels(masked), max_depth))
        device = pending.device
        builder = self._builder_for(plan.max_nodes * (depth if masked else 1), device)
        root = pending[-1]
        pending = pending.clamp_max(self.input_limit - 1)
        if processing is not None:
            # Left where the target's processors are (see proposal_log_probs_rows).
            sequence = sequence.clamp_max(self.vocab_limit - 1)
        root_index = length + pending.shape[0] - 1
        depths = torch.arange(-pending.shape[0] + 1, 1, device=device)
        causal = torch.ones(pending.shape[0], pending.shape[0], dtype=torch.bool, device=device).tril_()
        logits = yield RowForward(pending, depths, causal, root_index)
        builder.start(root)
        root_log_probs, root_order = self._log_probs(logits[-1], processing, sequence)
        frontier = slice(0, 1)
        child_log_probs, child_order = root_log_probs[None], root_order[None]
        cached_depth, forwards, fed_tokens = 0, 1, pending.shape[0]
        real_nodes = torch.zeros((), dtype=torch.long, device=device)
        for level in range(1, depth + 1):
            new, real_nodes = self._add_level(plan, level, masked, frontier, child_log_probs, child_order, real_nodes)
            if new is None:
                break
            full = not masked and builder.size - 1 >= plan.max_nodes
            if level == depth or full or (not masked and not plan.grows(level)):
                break
            frontier = new
            child_log_probs, child_order = yield from self._level_forward(new, level, root_index, processing, sequence)
            forwards, fed_tokens = forwards + 1, fed_tokens + new.stop - new.start
            cached_depth = level
        real = (yield SlotsRead(builder.valid[: builder.size])) if builder.masked else None
        tree, greedy_depth, slots = builder.finish(real)
        return Drafted(tree, root_log_probs, cached_depth, greedy_depth, forwards, fed_tokens, slots)
