"""One level of every row's own draft tree (`grow.draft_own_trees`), on tensors only: which of its frontier's top-k
candidates each row keeps (`choose`) and their writing into the padded levels (`write`).

A masked level holds a number of slots known on the host, so the draft's log-probabilities, the choice and the
writing run as one function of the level's inputs (`masked_level`, or `scored_masked_level` from the draft's logits
where every row shares its processing, `DraftScoring`), one compiled region where the pair runs compiled
(`MASKED_LEVEL`, `SCORED_MASKED_LEVEL`) whose frontier, slots and rows are symbolic (`compiled.Captured`), so trees
of other widths share a graph; whether a node cap binds still specialises one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policies import LevelChoice, LevelRules
from .compiled import Captured
from .draft import DraftScoring, root_of


@dataclass
class Slots:
    """Every row's padded levels as they grow, in slots 0..C-1: tokens, path log-probabilities, candidate indices
    (frontier slot times `top_k` plus rank) and which slots are dropped (B, C); ancestor rows (B, C, C); how many
    levels each row may grow (`reach`, (B,)); sage-gt's values of the frontier's nodes (B, F; None at the first
    level, whose parent is the root, worth 1); what the rows' policy measures of each expanded slot (`statistics`,
    (B, C, s), NaN until its level expands it; None where it measures nothing, `NodeMeasure`)."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    candidates: torch.Tensor
    dropped: torch.Tensor
    ancestors: torch.Tensor
    reach: torch.Tensor
    parent_values: torch.Tensor | None = None
    statistics: torch.Tensor | None = None

    @staticmethod
    def start(root: torch.Tensor, capacity: int, reach: torch.Tensor, measured: int = 0) -> Slots:
        """Every row's `capacity` slots holding its root (B,) alone: kept, its own ancestor, of path log-probability
        0 (the other slots written as the levels grow); with `measured` values a slot (`NodeMeasure.width`), their
        `statistics`, NaN until a level writes them."""
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
        statistics = torch.full((rows, capacity, measured), torch.nan, device=device) if measured else None
        return Slots(tokens, log_probs, candidates, dropped, ancestors, reach, statistics=statistics)


def root_slots(
    logits: torch.Tensor,
    pending: torch.Tensor,
    last: torch.Tensor,
    start: torch.Tensor,
    reach: torch.Tensor,
    capacity: int,
    scoring: DraftScoring | None,
    measured: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, Slots]:
    """From the draft's `logits` (B, P, V) over each row's `pending` tokens (B, P), the last real one (`last`, (B,))
    its root: the root's logits (B, 1, V), or under `scoring` (where every row shares it) its proposal
    log-probabilities and their ranking key (`root_of`); the roots' positions (`start` (B,) plus `last`); and the
    `capacity` slots holding the roots, with room for `measured` values a slot (`Slots.start`)."""
    root, root_scores, root_order = root_of(logits, pending, last, scoring)
    return root_scores, root_order, start + last, Slots.start(root, capacity, reach, measured)


ROOT_SLOTS = Captured(root_slots, "draft root")


@dataclass(frozen=True)
class Place:
    """Where a level goes, as host numbers: the level (1-based), its frontier's slots (`frontier`, start and stop),
    the slots written before it (`size`), whether a row's node cap may bind (`capped`) and whether some row's reach
    ends above it (`cut`)."""

    level: int
    frontier: tuple[int, int]
    size: int
    capped: bool
    cut: bool


@dataclass
class Choice:
    """A level's selection among its frontier's top-k candidates (B, F, top_k): their tokens and the rules' choice
    (path log-probabilities, scores, values, which each row drops), `flat_drop` (B, F * top_k) the drops flat."""

    tokens: torch.Tensor
    level: LevelChoice
    flat_drop: torch.Tensor


def choose(
    slots: Slots,
    rules: LevelRules,
    place: Place,
    child_log_probs: torch.Tensor,
    child_order: torch.Tensor,
    kept: torch.Tensor | None = None,
) -> Choice:
    """Which candidates among its frontier's top-k (by the ranking key `child_order`, of log-probabilities
    `child_log_probs` (B, F, V)) each row drops at `place`: those its rule (`kept`: the fixed rows' masks, see
    `LevelRules.kept`), its reach and its node cap reject (the frontier's slots take what the rules' `measure` says
    of their distributions). Compiled, the reach is applied whether or not `place`
    says some row's ends above the level (where none does it drops nothing), and so is the node cap where no row is
    valued, so that one graph serves both. A cap that cannot bind drops nothing there: every kept candidate scores
    above the dropped ones, and where a level holds fewer slots than a row keeps (the first level, its caps all
    equal) the best by score are its first by rank, as eager writing takes them. A valued row's scores need not
    follow its ranks, so with one the cap stays a host branch."""
    top = child_order.topk(rules.top_k, dim=-1)
    # Ranked by the log-probabilities themselves (no warpers), the top values are theirs.
    top_log_probs = top.values if child_order is child_log_probs else child_log_probs.gather(-1, top.indices)
    if rules.measure is not None:
        measured = rules.measure.measure(child_log_probs, top_log_probs)
        slots.statistics[:, place.frontier[0] : place.frontier[1]] = measured
    left = None
    if (torch.compiler.is_compiling() and not rules.valued) or place.capped:
        # Each row keeps its best children within what it has left.
        left = slots.dropped[:, 1 : place.size].sum(1) + (rules.caps - (place.size - 1))
    parent_log_probs = slots.log_probs[:, place.frontier[0] : place.frontier[1]]
    chosen = rules.select(place.level, parent_log_probs, slots.parent_values, top_log_probs, left, kept)
    if torch.compiler.is_compiling() or place.cut:
        chosen.drop |= (slots.reach < place.level)[:, None, None]
    return Choice(top.indices, chosen, chosen.drop.flatten(1))


def write(slots: Slots, rules: LevelRules, place: Place, choice: Choice, count: int) -> torch.Tensor | None:
    """The level's gathers: every row's `count` first candidates, its kept ones first (the rest dropped slots),
    written in place as the slots after `place.size` (tokens, path log-probabilities, dropped flags, candidate
    indices, ancestor rows). Returns the new slots' sage-gt values (B, count; None where no row is valued)."""
    flat_drop, chosen, capacity = choice.flat_drop, choice.level, slots.ancestors.shape[2]
    new = slice(place.size, place.size + count)
    # Each row's kept candidates first, by frontier slot then rank (int32: see `tree.deepest_rows`).
    order = torch.argsort(flat_drop.to(torch.int32), dim=1, stable=True)[:, :count]
    _gather_into(slots.tokens[:, new], choice.tokens.flatten(1), order)
    _gather_into(slots.log_probs[:, new], chosen.cumulative.masked_fill(chosen.drop, -torch.inf).flatten(1), order)
    _gather_into(slots.dropped[:, new], flat_drop, order)
    slots.candidates[:, new] = order
    parent = (order // rules.top_k)[:, :, None].expand(-1, -1, capacity)
    _gather_into(slots.ancestors[:, new], slots.ancestors[:, place.frontier[0] : place.frontier[1]], parent)
    slots.ancestors[:, new, new].diagonal(dim1=1, dim2=2).fill_(True)
    if chosen.values is None:
        return None
    return chosen.values.flatten(1).masked_fill(flat_drop, 0.0).gather(1, order)


def masked_level(
    slots: Slots,
    rules: LevelRules,
    place: Place,
    count: int,
    child_log_probs: torch.Tensor,
    child_order: torch.Tensor,
    kept: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """A masked level of `count` slots at `place`: `choose` then `write`. Returns the new slots' values, and their
    tokens (B, count) and ancestor rows over the slots written so far and the next (B, count, size + count + 1):
    the tokens and their visibility with its edges (`with_edges`) as the level's draft forward takes them
    (compiled, both with a contiguous tensor's strides, which its graph expects; eager, the tokens a view)."""
    choice = choose(slots, rules, place, child_log_probs, child_order, kept)
    values = write(slots, rules, place, choice, count)
    end = place.size + count
    fed, visible = slots.tokens[:, place.size : end], slots.ancestors[:, place.size : end, : end + 1]
    if not torch.compiler.is_compiling():
        return values, fed, visible.contiguous()
    # A compiled forward's graph checks strides, even a size-1 dimension's (which `contiguous` leaves as they are).
    standard = torch.contiguous_format
    return values, fed.clone(memory_format=standard), visible.clone(memory_format=standard)


def scored_masked_level(
    slots: Slots,
    rules: LevelRules,
    place: Place,
    count: int,
    logits: torch.Tensor,
    scoring: DraftScoring,
    kept: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """`masked_level` from the draft's `logits` (B, F, V) of the frontier, under the `scoring` every row shares: the
    frontier's proposal log-probabilities and ranking key are taken here, in the level's region."""
    known = slots.tokens[:, : place.size]
    ancestors = slots.ancestors[:, place.frontier[0] : place.frontier[1], : place.size]
    log_probs, order = scoring.log_probs(logits, known, ancestors, place.level - 1)
    return masked_level(slots, rules, place, count, log_probs, log_probs if order is None else order, kept)


MASKED_LEVEL = Captured(masked_level, "draft level")
SCORED_MASKED_LEVEL = Captured(scored_masked_level, "scored draft level")


def _gather_into(target: torch.Tensor, source: torch.Tensor, index: torch.Tensor) -> None:
    """`target` (a view of the slots) = `source` gathered along dim 1 at `index`: written by the gather itself when
    eager, copied when compiling (the compiler takes no `out=` view)."""
    if torch.compiler.is_compiling():
        target.copy_(source.gather(1, index))
    else:
        torch.gather(source, 1, index, out=target)
