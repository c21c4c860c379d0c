"""Growing every row's draft tree of a step with one draft forward per level over all rows.

`draft_rows` grows one tree of rank paths shared by every row (a chain, a static tree) as views of the draft's top-k,
without gathers or a read; `draft_own_trees` grows each row's own tree by its plan's level rule (`LevelRules`, the
policies' rules as per-row tensors), in any mix of plans, with one read at the end. A row near its token budget
grows at most the levels it may use.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..device_tensors import arange, host_values
from ..policies import LevelChoice, LevelRules, TreePlan
from .draft import GrownTrees, proposal_log_probs, sequence_proposal_log_probs
from .model_runner import ModelRunner
from .processing import NodeProcessing, RowSequences, same_processing, uniform_processing
from .tree import Trees, TreeShape


@dataclass
class GrowthInputs:
    """What growing every row's tree reads: the draft's runner; each row's emitted tokens the draft has not seen,
    `pending` (B, P), its first `counts[b]` (the last of them the row's root); how many levels each row may grow
    (`max_depths`, its budget); the ids the draft may propose (`vocab_limit`) and embed (`input_limit`); and each row's
    config processing of the draft's logits (None: none) and tokens so far (read only where a row processes its
    logits)."""

    draft: ModelRunner
    pending: torch.Tensor
    counts: list[int]
    max_depths: list[int]
    vocab_limit: int
    input_limit: int
    processings: Sequence[NodeProcessing | None]
    sequences: RowSequences
    plain: bool = field(init=False)

    def __post_init__(self) -> None:
        # Whether no row processes its logits: then every level's log-probabilities come from one operation.
        self.plain = uniform_processing(self.processings)

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


def draft_rows(inputs: GrowthInputs, shape: TreeShape, top_k: int) -> GrownTrees:
    """Grow every row's tree of `shape` with one draft forward per level over all rows, row b at most
    `inputs.max_depths[b]` levels (the others' deeper nodes invalid)."""
    device, rows = inputs.pending.device, inputs.pending.shape[0]
    depth = min(shape.depth, max(inputs.max_depths))
    n = shape.level_ends[depth]
    root_logits, root, root_position, fed_tokens = _root_forward(inputs)
    tokens = torch.empty(rows, n, dtype=torch.long, device=device)
    log_probs = torch.zeros(rows, n, device=device)
    tokens[:, 0] = root
    root_log_probs, root_order = inputs.log_probs(root_logits[:, None])
    child_log_probs, child_order = root_log_probs, root_order
    cached_depth, forwards = 0, 1
    for level in range(1, depth + 1):
        new = _shape_level(shape, level, top_k, child_log_probs, child_order, tokens, log_probs)
        if level == depth:
            break
        visible = shape.block(new, slice(1, new.stop))
        logits = inputs.draft.forward_rows(tokens[:, new], shape.depths[new], root_position, visible)
        forwards, fed_tokens = forwards + 1, fed_tokens + rows * (new.stop - new.start)
        ancestors = shape.ancestors[new, : new.stop]
        child_log_probs, child_order = inputs.log_probs(logits, tokens[:, : new.stop], ancestors, level)
        cached_depth = level
    trees, greedy_depth, row_depths = _shape_trees(shape, tokens, log_probs, depth, inputs.max_depths)
    sizes = [shape.level_ends[d] for d in row_depths]
    cached = [cached_depth] * rows
    return GrownTrees(trees, root_log_probs[:, 0], cached, greedy_depth, sizes, row_depths, forwards, fed_tokens)


def _shape_level(
    shape: TreeShape,
    level: int,
    top_k: int,
    child_log_probs: torch.Tensor,
    child_order: torch.Tensor,
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
) -> slice:
    """Write `level` of every row's tree of `shape` into its `tokens` and path `log_probs` (B, N): each frontier
    node's children are the ranks of its draft top-k the shape names, from the frontier's log-probabilities and
    ranking key `child_log_probs`, `child_order` (B, F, V). Returns the level's nodes."""
    rows = tokens.shape[0]
    frontier, new = shape.level(level - 1), shape.level(level)
    top = child_order.topk(top_k, dim=-1)
    # Ranked by the log-probabilities themselves (no warpers), the top values are theirs.
    top_log_probs = top.values if child_order is child_log_probs else child_log_probs.gather(-1, top.indices)
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
    return new


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
    trees = Trees(tokens, log_probs, shape.parents[:n], shape.depths[:n], shape.ancestors[:n, :n], depth, valid)
    if valid is None:
        greedy_depth = shape.greedy_depth(n).expand(rows)
    else:
        greedy_depth = (shape.greedy_path[None, :n] * valid).amax(dim=1)
    return trees, greedy_depth, row_depths


def _root_forward(inputs: GrowthInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Feed every row's tokens the draft has not seen (its first `counts[b]` of `pending` (B, P)) in one forward;
    returns the draft's logits after each row's root (its last pending token) (B, V), the roots (B,), their
    positions (B,) and the tokens the forward carried (padding included)."""
    draft, pending, counts = inputs.draft, inputs.pending, inputs.counts
    device, rows = pending.device, pending.shape[0]
    last = host_values([c - 1 for c in counts], device)
    start = draft.positions(host_values(draft.lengths, device))
    fed = pending.clamp_max(inputs.input_limit - 1)
    logits = draft.forward_rows(fed, arange(fed.shape[1], device), start, None, counts)
    root_logits = logits.gather(1, last[:, None, None].expand(rows, 1, logits.shape[2]))[:, 0]
    return root_logits, pending.gather(1, last[:, None])[:, 0], start + last, rows * fed.shape[1]


def draft_own_trees(inputs: GrowthInputs, plans: Sequence[TreePlan]) -> GrownTrees:
    """Grow every row's tree by its own plan's level rule (SAGE's, sage-gt's, a fixed tree's, in any mix), each of its
    own depth and width, with one draft forward per level over all rows.

    Each level is one number of slots for every row: a fixed one, sized for the widest row (masked, on accelerators),
    or, unmasked (on the CPU, where a read costs nothing and a forward's tokens cost compute), the most children a
    row keeps, read level by level with whether any row's next level pays. Each row keeps the children its plan's
    rule selects (`LevelRules.select`, every row's parameters on the device from one copy), first by frontier slot
    then rank (the order a fixed tree's nodes have), the rest dropped. A level writes only what the next one reads
    (tokens, path log-probabilities, ancestor rows, which slots are dropped, each slot's candidate index); parents,
    ranks and depths follow from those once, after the growth. One read of every row's real slots then gathers each
    row's tree to its own nodes (per-row structure, padded; `slots` maps each node to the slot the draft was fed it
    at). Row b grows at most `inputs.max_depths[b]` levels.
    """
    device, rows = inputs.pending.device, inputs.pending.shape[0]
    masked = next((plan.masked for plan in plans if plan.masked is not None), device.type != "cpu")
    limits = zip(plans, inputs.max_depths, strict=True)
    row_depths = [max(0, min(plan.levels(masked), limit)) for plan, limit in limits]
    levels = max(row_depths)
    root_logits, root, root_position, fed_tokens = _root_forward(inputs)
    capacity = 1 + levels * max(plan.max_nodes for plan in plans)
    rules = LevelRules.of(plans, row_depths, device)
    growth = _Growth.start(root, capacity, rules.reach, min(row_depths))
    root_log_probs, root_order = inputs.log_probs(root_logits[:, None])
    child_log_probs, child_order = root_log_probs, root_order
    selection = _Selection.of(plans, rules, masked)
    cached_depth, forwards = 0, 1
    for level in range(1, levels + 1):
        choice = _select_children(selection, growth, level, child_log_probs, child_order)
        if choice.count == 0:  # (masked: every row's node cap is 0, a plain step)
            break
        new = _write_level(growth, choice, rules)
        if level == levels or not choice.grows:
            break
        # The new nodes' ancestor rows over slots 0..size are their visibility with its edges (`with_edges`): the
        # root before the block, the slot after it not yet grown.
        visible = growth.ancestors[:, new, : growth.size + 1]
        depths = arange(levels + 1, device)[level : level + 1].expand(choice.count)
        logits = inputs.draft.forward_rows(growth.tokens[:, new], depths, root_position, visible)
        forwards, fed_tokens = forwards + 1, fed_tokens + rows * choice.count
        tokens, ancestors = growth.tokens[:, : growth.size], growth.ancestors[:, new, : growth.size]
        child_log_probs, child_order = inputs.log_probs(logits, tokens, ancestors, level)
        cached_depth = level
    return _own_trees(growth, rules.top_k, root_log_probs, cached_depth, forwards, fed_tokens)


@dataclass
class _Growth:
    """Every row's padded levels as they grow, in slots 0..C-1: tokens, path log-probabilities, candidate indices
    (frontier slot times `top_k` plus rank) and which slots are dropped (B, C), and ancestor rows (B, C, C). Between
    levels it carries what the next one reads: the slots written (`size`), the last level's (`frontier`), where each
    level ends (`level_ends`), how many levels each row may grow (`reach`, (B,)), the fewest any row may, as known on
    the host (`shallowest`), and sage-gt's values of the frontier's nodes (B, F)."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    candidates: torch.Tensor
    dropped: torch.Tensor
    ancestors: torch.Tensor
    reach: torch.Tensor
    shallowest: int
    size: int
    frontier: slice
    level_ends: list[int]
    parent_values: torch.Tensor | None = None  # the first level's parent is the root, worth 1

    @staticmethod
    def start(root: torch.Tensor, capacity: int, reach: torch.Tensor, shallowest: int) -> _Growth:
        """Every row's `capacity` slots holding its root (B,) alone: kept, its own ancestor, of path log-probability
        0 (the other slots written as the levels grow)."""
        rows, device = root.shape[0], root.device
        tokens = torch.empty(rows, capacity, dtype=torch.long, device=device)
        log_probs = torch.empty(rows, capacity, device=device)
        candidates = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        dropped = torch.empty(rows, capacity, dtype=torch.bool, device=device)
        ancestors = torch.zeros(rows, capacity, capacity, dtype=torch.bool, device=device)
        ancestors[:, 0, 0] = True
        dropped[:, 0] = False
        tokens[:, 0] = root
        log_probs[:, 0] = 0.0
        return _Growth(tokens, log_probs, candidates, dropped, ancestors, reach, shallowest, 1, slice(0, 1), [1])


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
class _Choice:
    """A level's selection among its frontier's top-k candidates (B, F, top_k): their tokens and the rules' choice
    (path log-probabilities, scores, values, which each row drops), `flat_drop` (B, F * top_k) the drops flat; the
    slots the level holds (`count`) and whether the growth goes on below it (`grows`)."""

    tokens: torch.Tensor
    level: LevelChoice
    flat_drop: torch.Tensor
    count: int
    grows: bool


def _select_children(
    selection: _Selection, growth: _Growth, level: int, child_log_probs: torch.Tensor, child_order: torch.Tensor
) -> _Choice:
    """`level`'s selection of children: each row keeps the candidates among its frontier's top-k (by the ranking key
    `child_order`, of log-probabilities `child_log_probs` (B, F, V)) that its rule, its reach and its node cap allow;
    the level holds a fixed number of slots (masked), or the most children a row keeps (`_kept_count`)."""
    plans, caps, rules = selection.plans, selection.caps, selection.rules
    top = child_order.topk(rules.top_k, dim=-1)
    top_log_probs = top.values if child_order is child_log_probs else child_log_probs.gather(-1, top.indices)
    bound = (growth.frontier.stop - growth.frontier.start) * max(plan.max_children(level) for plan in plans)
    count = min(bound, max(caps))
    left = None
    if growth.size - 1 + (count if selection.masked else bound) > min(caps):
        # A node cap may bind: each row keeps its best children within what it has left.
        left = growth.dropped[:, 1 : growth.size].sum(1) + (rules.caps - (growth.size - 1))
    parent_log_probs = growth.log_probs[:, growth.frontier]
    chosen = rules.select(level, parent_log_probs, growth.parent_values, top_log_probs, left)
    if level > growth.shallowest:  # some row's budget (or value) ends above this level
        chosen.drop |= (growth.reach < level)[:, None, None]
    flat_drop = chosen.drop.flatten(1)
    grows = True
    if not selection.masked:
        count, grows = _kept_count(rules, growth, level, chosen, flat_drop)
    return _Choice(top.indices, chosen, flat_drop, count, grows)


def _kept_count(
    rules: LevelRules, growth: _Growth, level: int, chosen: LevelChoice, flat_drop: torch.Tensor
) -> tuple[int, bool]:
    """How many slots an unmasked level holds, and whether the growth goes on below it, from which candidates each
    row drops (`flat_drop`, (B, F * top_k)) and the rules' choice."""
    # The level holds the most children a row keeps, and the growth stops at the first level no row adds to; a row
    # with a forward price grows below this level while the level's value pays for a draft forward over it
    # (`LevelRules.pays`). One read a level.
    per_row = flat_drop.shape[1] - flat_drop.sum(1)
    if rules.valued:
        paying = rules.pays(chosen, per_row)
        growth.reach, growth.shallowest = torch.where(paying, growth.reach, level), level
        count, grows = torch.stack([per_row.max(), paying.any()]).tolist()
        return count, bool(grows)
    return int(per_row.max()), True


def _write_level(growth: _Growth, choice: _Choice, rules: LevelRules) -> slice:
    """The level's gathers: every row's `choice.count` first candidates, its kept ones first (the rest dropped
    slots), written as the growth's next level (tokens, path log-probabilities, dropped flags, candidate indices,
    ancestor rows and sage-gt's values), which becomes the frontier. Returns the level's slots."""
    flat_drop, top_k, capacity, chosen = choice.flat_drop, rules.top_k, growth.ancestors.shape[2], choice.level
    # Each row's kept candidates first, by frontier slot then rank.
    order = torch.argsort(flat_drop.to(torch.uint8), dim=1, stable=True)[:, : choice.count]
    new = slice(growth.size, growth.size + choice.count)
    torch.gather(choice.tokens.flatten(1), 1, order, out=growth.tokens[:, new])
    kept_log_probs = chosen.cumulative.masked_fill(chosen.drop, -torch.inf).flatten(1)
    torch.gather(kept_log_probs, 1, order, out=growth.log_probs[:, new])
    torch.gather(flat_drop, 1, order, out=growth.dropped[:, new])
    growth.candidates[:, new] = order
    parent = (order // top_k)[:, :, None].expand(-1, -1, capacity)
    torch.gather(growth.ancestors[:, growth.frontier], 1, parent, out=growth.ancestors[:, new])
    growth.ancestors[:, new, new].diagonal(dim1=1, dim2=2).fill_(True)
    if chosen.values is not None:
        growth.parent_values = chosen.values.flatten(1).masked_fill(flat_drop, 0.0).gather(1, order)
    growth.size, growth.frontier = new.stop, new
    growth.level_ends.append(growth.size)
    return new


def _own_trees(
    growth: _Growth, top_k: int, root_log_probs: torch.Tensor, cached_depth: int, forwards: int, fed_tokens: int
) -> GrownTrees:
    """The final gather of the trees: every row's real slots of the grown levels, read once, as its own tree
    (`_gathered`); `root_log_probs` (B, 1, V), the levels the draft cache holds, the draft forwards and tokens fed."""
    # The step's one read for the trees: every row's real slots.
    flags = growth.dropped[:, : growth.size].tolist()
    real = [[slot for slot, drop in enumerate(row) if not drop] for row in flags]
    trees, greedy_depth, tree_depths = _gathered(
        growth.tokens, growth.log_probs, growth.candidates, growth.ancestors, top_k, real, growth.level_ends
    )
    sizes = [len(slots) for slots in real]
    cached = [cached_depth] * len(real)
    return GrownTrees(trees, root_log_probs[:, 0], cached, greedy_depth, sizes, tree_depths, forwards, fed_tokens, real)


def _gathered(
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    candidates: torch.Tensor,
    ancestors: torch.Tensor,
    top_k: int,
    real: list[list[int]],
    level_ends: list[int],
) -> tuple[Trees, torch.Tensor, list[int]]:
    """Each row's `real` slots of its padded levels gathered into a tree of its own nodes (per-row structure, padded
    to the largest, the padding invalid), how deep each row's draft top-1 path reaches in it (B,), and each row's
    tree depth (host). A slot's parent is the frontier slot its candidate index (`candidates`: frontier slot times
    `top_k` plus rank) names, in the level before its own (`level_ends`: where each level ends)."""
    device = tokens.device
    rows, n, width = len(real), max(len(slots) for slots in real), tokens.shape[1]
    remap = [[0] * width for _ in real]
    depths, starts, fixed, tree_depths = [], [], [], []
    for b, slots in enumerate(real):
        for node, slot in enumerate(slots):
            remap[b][slot] = node
            depth = bisect.bisect_right(level_ends, slot)
            depths.append(depth)
            starts.append(level_ends[depth - 2] if depth > 1 else 0)
            fixed.append(-1 if node == 0 else -2)  # the root has no parent; real nodes take theirs
        tree_depths.append(depth)  # slots ascend, so the last is the deepest
        pad = range(len(slots), n)
        depths.extend(0 for _ in pad)
        starts.extend(0 for _ in pad)
        fixed.extend(pad)  # padding is its own parent
    padded = [v for slots in real for v in slots + [0] * (n - len(slots))]
    flat = padded + [v for row in remap for v in row] + depths + starts + fixed + [len(slots) for slots in real]
    written = host_values(flat, device)
    index, new_index = written[: rows * n].view(rows, n), written[rows * n : rows * (n + width)].view(rows, width)
    node_depths, node_starts, node_fixed = written[rows * (n + width) : rows * (4 * n + width)].view(3, rows, n)
    own = arange(n, device)
    is_real = own[None] < written[rows * (4 * n + width) :, None]
    node_candidates = candidates.gather(1, index)
    parents = new_index.gather(1, node_candidates // top_k + node_starts)
    node_parents = torch.where(node_fixed >= -1, node_fixed, parents)
    by_row = ancestors.gather(1, index[:, :, None].expand(-1, -1, ancestors.shape[2]))
    node_ancestors = by_row.gather(2, index[:, None, :].expand(-1, n, -1))
    node_ancestors &= is_real[:, :, None] & is_real[:, None, :]
    off_path = node_ancestors & (node_candidates % top_k != 0)[:, None, :]
    trees = Trees(
        tokens.gather(1, index),
        log_probs.gather(1, index).masked_fill(~is_real, -torch.inf),
        node_parents,
        node_depths,
        node_ancestors,
        0,
        is_real,
    )
    trees.depth = max(tree_depths)
    return trees, (node_depths * ~off_path.any(dim=2) * is_real).amax(dim=1), tree_depths


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
