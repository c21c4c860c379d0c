"""Growing every row's draft tree of a step with one draft forward per level over all rows.

`draft_rows` grows one tree of rank paths shared by every row (a chain, a static tree) as views of the draft's top-k,
without gathers or a read; `draft_own_trees` grows each row's own tree by its plan's level rule (`LevelRules`, the
policies' rules as per-row tensors), in any mix of plans, with one read at the end. A row near its token budget
grows at most the levels it may use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..device_tensors import arange, filled, host_values
from ..policies import LevelRules, NodeMeasure, TreePlan
from ..policies.levels import joined_measure, split_measured
from .draft import DraftScoring, GrownTrees, proposal_log_probs, sequence_proposal_log_probs
from .level_step import MASKED_LEVEL, ROOT_SLOTS, SCORED_MASKED_LEVEL, Choice, Place, Slots, choose, write
from .model_runner import ModelRunner
from .processing import NodeProcessing, RowSequences, batched_processing, same_processing, uniform_processing
from .shape_step import SCORED_SHAPE_LEVEL, SHAPE_LEVEL, SHAPE_ROOT
from .slot_trees import slot_trees
from .tree import Trees, TreeShape


@dataclass
class GrowthInputs:
    """What growing every row's tree reads: the draft's runner; each row's emitted tokens the draft has not seen,
    `pending` (B, P), its first `counts[b]` (the last of them the row's root); how many levels each row may grow
    (`max_depths`, its budget); the ids the draft may propose (`vocab_limit`) and embed (`input_limit`); and each row's
    config processing of the draft's logits (None: none) and tokens so far (read only where a row processes its
    logits); a head's `features` of the tokens before the pending ones (B, P, F), from the target (None: a model
    drafts); `confidence`, where a row verifies relaxed, the measure of each expanded node's confidence its
    verification reads (`Trees.confidence`; None: none)."""

    draft: ModelRunner
    pending: torch.Tensor
    counts: list[int]
    max_depths: list[int]
    vocab_limit: int
    input_limit: int
    processings: Sequence[NodeProcessing | None]
    sequences: RowSequences
    features: torch.Tensor | None = None
    confidence: NodeMeasure | None = None
    plain: bool = field(init=False)
    scoring: DraftScoring | None = field(init=False)

    def __post_init__(self) -> None:
        # Whether no row processes its logits: then every level's log-probabilities come from one operation.
        self.plain = uniform_processing(self.processings)
        self.scoring = _shared_scoring(self.processings, self.sequences, self.vocab_limit, self.pending.device)

    def log_probs(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor | None = None,
        ancestors: torch.Tensor | None = None,
        depth: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's proposal log-probabilities and ranking key (B, m, V) from the draft's `logits` (B, m, V) of
        nodes `depth` deep (`_log_probs`)."""
        processings, sequences = self.processings, self.sequences
        return _log_probs(logits, self.plain, processings, sequences, self.vocab_limit, tokens, ancestors, depth)


def _shared_scoring(
    processings: Sequence[NodeProcessing | None], sequences: RowSequences, vocab_limit: int, device: torch.device
) -> DraftScoring | None:
    """The `DraftScoring` every row shares, taken in the levels' compiled regions (`batched_processing`), over tokens
    on the draft's `device`; None where rows process their logits row by row, eager."""
    batched = batched_processing(processings, sequences)
    if batched is None or (batched[1] is not None and batched[1].device != device):
        return None
    return DraftScoring(vocab_limit, *batched)


def _root_scores(
    inputs: GrowthInputs, root_scores: torch.Tensor, root_order: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The roots' proposal log-probabilities and ranking key (B, 1, V'), from what the root's region returned: taken
    there under the rows' shared scoring (a key of None is the log-probabilities), else from the root's logits here."""
    if inputs.scoring is None:
        return inputs.log_probs(root_scores)
    return root_scores, root_scores if root_order is None else root_order


def draft_rows(inputs: GrowthInputs, shape: TreeShape, top_k: int, measure: NodeMeasure | None = None) -> GrownTrees:
    """Grow every row's tree of `shape` with one draft forward per level over all rows, row b at most
    `inputs.max_depths[b]` levels (the others' deeper nodes invalid); `measure` (None: nothing) what the rows' policy
    measures of each expanded node."""
    rows, policy_measure = inputs.pending.shape[0], measure
    measure = joined_measure(policy_measure, inputs.confidence)
    depth = min(shape.depth, max(inputs.max_depths))
    n = shape.level_ends[depth]
    logits, last, start, fed_tokens = _root_forward(inputs)
    root = (logits, inputs.pending, last, start, n, inputs.scoring, 0 if measure is None else measure.width)
    *scores, root_position, tokens, log_probs, statistics = SHAPE_ROOT(inputs.draft, *root)
    measured = None if measure is None else (measure, statistics)
    root_log_probs, root_order = _root_scores(inputs, *scores)
    frontier: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = (root_log_probs, root_order)
    cached_depth, forwards = 0, 1
    for level in range(1, depth + 1):
        new = shape.level(level)
        if isinstance(frontier, torch.Tensor):
            made = (frontier, inputs.scoring, tokens, log_probs, measured)
            fed = SCORED_SHAPE_LEVEL(inputs.draft, shape, level, top_k, *made)
        else:
            fed = SHAPE_LEVEL(inputs.draft, shape, level, top_k, *frontier, tokens, log_probs, measured)
        if level == depth:
            break
        visible = shape.block(new, slice(1, new.stop), rows)
        logits = inputs.draft.forward_rows(fed, shape.depths[new], root_position, visible)
        forwards, fed_tokens = forwards + 1, fed_tokens + rows * (new.stop - new.start)
        if inputs.scoring is not None:  # the level's log-probabilities are taken in the next level's region
            frontier = logits
        else:
            ancestors = shape.ancestors[new, : new.stop]
            frontier = inputs.log_probs(logits, tokens[:, : new.stop], ancestors, level)
        cached_depth = level
    trees, greedy_depth, row_depths = _shape_trees(shape, tokens, log_probs, depth, inputs.max_depths)
    measures = (policy_measure, inputs.confidence)
    trees.node_statistics, trees.confidence = split_measured(None if measured is None else measured[1], *measures)
    sizes = [shape.level_ends[d] for d in row_depths]
    cached = [cached_depth] * rows
    return GrownTrees(trees, root_log_probs[:, 0], cached, greedy_depth, sizes, row_depths, forwards, fed_tokens)


def _shape_trees(
    shape: TreeShape, tokens: torch.Tensor, log_probs: torch.Tensor, depth: int, max_depths: list[int]
) -> tuple[Trees, torch.Tensor, list[int]]:
    """Every row's grown tree of `shape`, `depth` levels of `tokens` and path `log_probs` (B, N), its nodes deeper
    than the row's budget (`max_depths`) allows invalid; how deep each row's draft top-1 path reaches in it (B,), and
    each row's tree depth (host)."""
    rows, n = tokens.shape
    row_depths = [min(depth, d) for d in max_depths]
    valid = None
    if min(row_depths) < depth:
        valid = shape.depths[None, :n] <= host_values(row_depths, tokens.device)[:, None]
    trees = Trees(tokens, log_probs, shape.parents[:n], shape.depths[:n], shape.prefix_ancestors(n), depth, valid)
    if valid is None:
        greedy_depth = shape.greedy_depth(n, rows)
    else:
        greedy_depth = (shape.greedy_path[None, :n] * valid).amax(dim=1)
    return trees, greedy_depth, row_depths


def _root_forward(inputs: GrowthInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Feed every row's tokens the draft has not seen (its first `counts[b]` of `pending` (B, P)) in one forward;
    returns the draft's logits (B, P, V), the index of each row's last pending token (its root) (B,), the rows'
    first positions (B,) and the tokens the forward carried (padding included)."""
    draft, pending, counts = inputs.draft, inputs.pending, inputs.counts
    device, rows = pending.device, pending.shape[0]
    last = host_values([c - 1 for c in counts], device)
    start = host_values(draft.positions(draft.lengths), device)
    fed = pending.clamp_max(inputs.input_limit - 1)
    # A head's tokens come with the target's features of the tokens before them; a model's alone.
    read = {} if inputs.features is None else {"features": inputs.features}
    logits = draft.forward_rows(fed, arange(fed.shape[1], device), start, None, counts, **read)
    return logits, last, start, rows * fed.shape[1]


def draft_own_trees(inputs: GrowthInputs, plans: Sequence[TreePlan]) -> GrownTrees:
    """Grow every row's tree by its own plan's level rule (SAGE's, sage-gt's, a fixed tree's, in any mix), each of its
    own depth and width, with one draft forward per level over all rows.

    Each level is one number of slots for every row: a fixed one, sized for the widest row (masked, on accelerators),
    or, unmasked (on the CPU, where a read costs nothing and a forward's tokens cost compute), the most children a
    row keeps, read level by level with whether any row's next level pays. Each row keeps the children its plan's
    rule selects (`LevelRules.select`, every row's parameters on the device from one copy), first by frontier slot
    then rank (the order a fixed tree's nodes have), the rest dropped. A level writes only what the next one reads
    (`level_step`: tokens, path log-probabilities, ancestor rows, which slots are dropped, each slot's candidate
    index); a masked level's choice and writes are one compiled region where the pair runs compiled. Parents, ranks
    and depths follow from those once, after the growth. One read of every row's real slots then gathers each
    row's tree to its own nodes (per-row structure, padded; `slots` maps each node to the slot the draft was fed it
    at). Row b grows at most `inputs.max_depths[b]` levels.
    """
    device, rows = inputs.pending.device, inputs.pending.shape[0]
    masked = next((plan.masked for plan in plans if plan.masked is not None), device.type != "cpu")
    limits = zip(plans, inputs.max_depths, strict=True)
    row_depths = [max(0, min(plan.levels(masked), limit)) for plan, limit in limits]
    levels = max(row_depths)
    logits, last, start, fed_tokens = _root_forward(inputs)
    capacity = 1 + levels * max(plan.max_nodes for plan in plans)
    rules = LevelRules.of(plans, row_depths, device)
    policy_measure, rules.measure = rules.measure, joined_measure(rules.measure, inputs.confidence)
    measured = 0 if rules.measure is None else rules.measure.width
    root = (logits, inputs.pending, last, start, rules.reach, capacity, inputs.scoring, measured)
    *scores, root_position, slots = ROOT_SLOTS(inputs.draft, *root)
    growth = _Growth(slots, min(row_depths), _Selection.of(plans, rules, masked))
    root_log_probs, root_order = _root_scores(inputs, *scores)
    frontier: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = (root_log_probs, root_order)
    cached_depth, forwards = 0, 1
    for level in range(1, levels + 1):
        count, grows, fed = _grow_level(inputs, growth, level, frontier)
        if count == 0:  # (masked: every row's node cap is 0, a plain step)
            break
        new = growth.advance(count)
        if level == levels or not grows:
            break
        slots = growth.slots
        if fed is None:
            # The new nodes' ancestor rows over slots 0..size are their visibility with its edges (`with_edges`):
            # the root before the block, the slot after it not yet grown.
            fed = slots.tokens[:, new], slots.ancestors[:, new, : growth.size + 1]
        logits = inputs.draft.forward_rows(fed[0], filled(level, count, device), root_position, fed[1])
        forwards, fed_tokens = forwards + 1, fed_tokens + rows * count
        if masked and inputs.scoring is not None:  # the level's log-probabilities are taken in the next level's region
            frontier = logits
        else:
            tokens, ancestors = slots.tokens[:, : growth.size], slots.ancestors[:, new, : growth.size]
            frontier = inputs.log_probs(logits, tokens, ancestors, level)
        cached_depth = level
    made = (rules.top_k, policy_measure, root_log_probs, cached_depth, forwards, fed_tokens)
    return _own_trees(inputs, growth, *made)


@dataclass
class _Selection:
    """What every level's selection of children reads of the rows' plans: the plans, their rules on the device,
    each row's node cap (host) and whether the levels are grown masked (a fixed number of slots a level)."""

    plans: Sequence[TreePlan]
    rules: LevelRules
    caps: list[int]
    masked: bool

    @staticmethod
    def of(plans: Sequence[TreePlan], rules: LevelRules, masked: bool) -> _Selection:
        """The `_Selection` of `plans` under `rules`."""
        return _Selection(plans, rules, [plan.max_nodes for plan in plans], masked)


@dataclass
class _Growth:
    """Every row's padded levels as they grow (`slots`, on the device) and what the host knows of them: the fewest
    levels any row may grow (`shallowest`), the slots written (`size`), the last level's (`frontier`), where each
    level ends (`level_ends`), and the rows' plans (`selection`)."""

    slots: Slots
    shallowest: int
    selection: _Selection
    size: int = 1
    frontier: slice = field(default_factory=lambda: slice(0, 1))
    level_ends: list[int] = field(default_factory=lambda: [1])

    def place(self, level: int, count: int) -> Place:
        """Where `level`'s `count` slots (at most) go."""
        capped = self.size - 1 + count > min(self.selection.caps)
        return Place(level, (self.frontier.start, self.frontier.stop), self.size, capped, level > self.shallowest)

    def advance(self, count: int) -> slice:
        """Take the `count` slots a level wrote as the frontier; returns them."""
        new = slice(self.size, self.size + count)
        self.size, self.frontier = new.stop, new
        self.level_ends.append(self.size)
        return new


def _grow_level(
    inputs: GrowthInputs, growth: _Growth, level: int, frontier: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
) -> tuple[int, bool, tuple[torch.Tensor, torch.Tensor] | None]:
    """Choose and write `level`'s children (`level_step`) from the frontier's draft logits (B, F, V), or their
    log-probabilities and ranking key (B, F, V each) where some row processes them: each row keeps the candidates
    among its frontier's top-k that its rule, its reach and its node cap allow. A masked level holds as many slots
    as the widest row may keep, as one compiled region; an unmasked one the most children a row keeps
    (`_kept_count`). Returns the level's slots, whether the growth goes on below it and, from a masked level's
    region, the new slots' tokens and visibility as their draft forward takes them (None: to be sliced)."""
    selection, slots = growth.selection, growth.slots
    plans, rules = selection.plans, selection.rules
    frontier_size = growth.frontier.stop - growth.frontier.start
    bound = frontier_size * max(plan.max_children(level) for plan in plans)
    count = min(bound, max(selection.caps))
    if selection.masked:
        if count == 0:
            return 0, False, None
        place = growth.place(level, count)
        kept = rules.kept(level, frontier_size, slots.tokens.device) if rules.fixed else None
        if isinstance(frontier, torch.Tensor):
            made = (frontier, inputs.scoring, kept)
            slots.parent_values, *fed = SCORED_MASKED_LEVEL(inputs.draft, slots, rules, place, count, *made)
        else:
            slots.parent_values, *fed = MASKED_LEVEL(inputs.draft, slots, rules, place, count, *frontier, kept)
        return count, True, tuple(fed)
    place = growth.place(level, bound)
    choice = choose(slots, rules, place, *frontier)
    count, grows = _kept_count(rules, growth, level, choice)
    if count > 0:
        slots.parent_values = write(slots, rules, place, choice, count)
    return count, grows, None


def _kept_count(rules: LevelRules, growth: _Growth, level: int, choice: Choice) -> tuple[int, bool]:
    """How many slots an unmasked level holds, and whether the growth goes on below it, from which candidates each
    row drops and the rules' choice."""
    # The level holds the most children a row keeps, and the growth stops at the first level no row adds to; a row
    # with a forward price grows below this level while the level's value pays for a draft forward over it
    # (`LevelRules.pays`). One read a level.
    flat_drop = choice.flat_drop
    per_row = flat_drop.shape[1] - flat_drop.sum(1)
    if rules.valued:
        paying = rules.pays(choice.level, per_row)
        growth.slots.reach, growth.shallowest = torch.where(paying, growth.slots.reach, level), level
        count, grows = torch.stack([per_row.max(), paying.any()]).tolist()
        return count, bool(grows)
    return int(per_row.max()), True


def _own_trees(
    inputs: GrowthInputs,
    growth: _Growth,
    top_k: int,
    policy_measure: NodeMeasure | None,
    root_log_probs: torch.Tensor,
    cached_depth: int,
    forwards: int,
    fed_tokens: int,
) -> GrownTrees:
    """The final gather of the trees: every row's real slots of the grown levels, read once, as its own tree
    (`slot_trees`), its measured values parted between the policy's measure and the verification's (`split_measured`);
    `root_log_probs` (B, 1, V), the levels the draft cache holds, the draft forwards and tokens fed."""
    slots = growth.slots
    # The step's one read for the trees: every row's real slots.
    flags = slots.dropped[:, : growth.size].tolist()
    real = [[slot for slot, drop in enumerate(row) if not drop] for row in flags]
    trees, visible, greedy_depth, tree_depths = slot_trees(inputs.draft, slots, top_k, real, growth.level_ends)
    measures = (policy_measure, inputs.confidence)
    trees.node_statistics, trees.confidence = split_measured(trees.node_statistics, *measures)
    sizes = [len(slots) for slots in real]
    cached = [cached_depth] * len(real)
    grown = GrownTrees(
        trees, root_log_probs[:, 0], cached, greedy_depth, sizes, tree_depths, forwards, fed_tokens, real
    )
    grown.visible = visible
    return grown


def _log_probs(
    logits: torch.Tensor,
    plain: bool,
    processings: Sequence[NodeProcessing | None],
    sequences: RowSequences,
    vocab_limit: int,
    tokens: torch.Tensor | None = None,
    ancestors: torch.Tensor | None = None,
    depth: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's proposal log-probabilities and ranking key (B, m, V) from the draft's `logits` (B, m, V) of nodes
    `depth` deep: at once when no row processes its logits or all share one processing, else row by row."""
    if plain:
        return proposal_log_probs(logits, None, vocab_limit, sequences)
    if isinstance(sequences, torch.Tensor):
        return proposal_log_probs(logits, processings[0], vocab_limit, sequences, tokens, ancestors, depth)
    shared = same_processing(processings)
    if shared is not None:
        return proposal_log_probs(logits, shared, vocab_limit, sequences, tokens, ancestors, depth)
    own = ancestors is not None and ancestors.ndim == 3
    parts = [
        sequence_proposal_log_probs(
            logits[b],
            processing,
            vocab_limit,
            sequences[b],
            None if tokens is None else tokens[b],
            ancestors[b] if own else ancestors,
            depth,
        )
        for b, processing in enumerate(processings)
    ]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
