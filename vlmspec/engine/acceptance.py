"""One step of many sequences as `(B, N)` tensors: every row's grown trees (`GrownTrees`, grown in `grow.py`) and
their acceptance, which runs as a fixed number of operations over all rows, its results read once for all rows.

A row near its token budget drafts the same levels as the others; its nodes past what the budget allows are
invalid (never accepted), and a row with its own generator draws only its valid nodes' uniforms, so it decodes as
it would alone. Rows whose generation config has logits processors process their logits row by row (the
processors see each node's own sequence); without processors nothing here loops over rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .accept import Verdict, accept_greedy_rows, accept_sampled_rows
from .choice import NodeProcessing, TargetSampler
from .device_tensors import host_values, zeros
from .draft import Drafted
from .report import StepReport, emitted_rows, pack_rows, read_rows
from .stopping import StringCheck
from .tree import Trees


@dataclass
class GrownTrees:
    """Every row's tree of a step, the draft's root log-probabilities (B, V), how many levels of each row's tree the
    draft cache holds, each row's greedy depth (B,) and valid nodes (`sizes`, host), the draft forwards and tokens
    fed (padding included), and each row's map from node to the slot the draft was fed it at when its levels were
    padded (`slots`; None, or None for a row, where nodes and slots coincide)."""

    trees: Trees
    root_log_probs: torch.Tensor
    cached_depths: list[int]
    greedy_depth: torch.Tensor
    sizes: list[int]
    depths: list[int]
    forwards: int
    fed_tokens: int
    slots: Sequence[list[int] | None] | None = None

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


#: Each row's tokens so far: one `(B, T)` tensor (each row padded with its own last token) when the rows share a
#: processing, else a list of each row's `(1, T_b)` (None where nothing reads it).
RowSequences = torch.Tensor | Sequence[torch.Tensor | None]


def uniform_processing(processings: Sequence[NodeProcessing | None]) -> bool:
    """Whether no row processes its logits (so every row's log-probabilities come from one batched operation)."""
    return all(p is None or not (p.sequence_processors or p.warpers) for p in processings)


def common_processing(processings: Sequence[NodeProcessing | None]) -> NodeProcessing | None:
    """The processing every row's equals, when one call can serve all rows (its sequence processors read a sequence
    as a set of ids); None when rows differ or none can."""
    shared = same_processing(processings)
    return shared if shared is not None and shared.batches_rows else None


def same_processing(processings: Sequence[NodeProcessing | None]) -> NodeProcessing | None:
    """The processing every row's equals (one call may then serve nodes of many rows whose sequences are equally
    long, `NodeProcessing.process_nodes`); None when rows differ."""
    first = processings[0]
    if first is None or not all(p is first or (p is not None and p.key == first.key) for p in processings):
        return None
    return first


@dataclass
class Acceptance:
    """A step's acceptance of every row: the verdicts (batched), the tokens each row emits (B, depth + 1) and each
    row's report, read once."""

    verdict: Verdict
    tokens: torch.Tensor
    reports: list[StepReport]


def accept_trees(
    drafted: GrownTrees,
    trees: Trees,
    logits: torch.Tensor,
    samplers: Sequence[TargetSampler],
    sequences: RowSequences,
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    statistics: torch.Tensor | None,
    with_tree: bool,
    strings: StringCheck | None = None,
    compact: bool = True,
) -> Acceptance:
    """Accept every row's tree from the target's `logits` (B, N, V) and read all rows' results at once. Greedy rows
    take the target's choices, sampling rows recursive rejection (rows of both rules in one batch are accepted both
    ways, each keeping its own); a sampled row whose verdict is in doubt (see `NodeProcessing.distribution`,
    `compact`) is accepted again alone from its full rows (a second read, only then). `trees` are `drafted.trees`
    where the target's logits are; `strings` checks the rows' stop strings after each emitted token (None: no row has
    any). One sequence is a batch of one."""
    rules = [s.do_sample for s in samplers]
    processings = [s.processing for s in samplers]
    plain = uniform_processing(processings)
    # A tree of its root alone (a plain step) warps its rows whole, as `generate` does: nothing to compact or doubt.
    compact = compact and trees.size > 1
    scores = _target_scores(logits, trees, processings, plain, sequences)
    greedy = None if all(rules) else accept_greedy_rows(trees, scores.argmax(-1))
    verdict = greedy
    if any(rules):
        probs, doubt = _target_distribution(scores, processings, plain, sequences, compact)
        generators = [s.generator for s in samplers]
        own = None if all(g is None for g in generators) else generators
        verdict = accept_sampled_rows(trees, probs, own, drafted.sizes)
        verdict.doubt = doubt
        if greedy is not None:
            verdict = _by_rule(host_values(rules, trees.tokens.device).bool(), verdict, greedy)
    tokens = emitted_rows(trees, verdict)
    stops = None if strings is None else strings.hits(tokens)
    packed = pack_rows(trees, verdict, tokens, eos_token_ids, rooms, drafted.greedy_depth, statistics, with_tree, stops)
    accepted = Acceptance(verdict, tokens, read_rows(packed, trees, tokens, with_tree, drafted.sizes))
    for b, report in enumerate(accepted.reports):
        if report.doubt:
            again = accept_trees(
                GrownTrees.one(drafted.row(b)),
                trees.row(b, drafted.sizes[b], drafted.depths[b]).rows(),
                logits[b : b + 1, : drafted.sizes[b]],
                samplers[b : b + 1],
                sequences[b : b + 1],
                eos_token_ids[b : b + 1],
                rooms[b : b + 1],
                None if statistics is None else statistics[b : b + 1],
                with_tree,
                None if strings is None else strings.row(b),
                compact=False,
            )
            _replace_row(accepted, b, again)
    return accepted


def _target_scores(
    logits: torch.Tensor,
    trees: Trees,
    processings: Sequence[NodeProcessing | None],
    plain: bool,
    sequences: RowSequences,
) -> torch.Tensor:
    """The target's `logits` (B, N, V) of every row's tree nodes under its row's processing (`plain`: none; one
    batched call where rows share it, else row by row), as float scores (B, N, V)."""
    if plain:
        return logits.float()
    if isinstance(sequences, torch.Tensor):
        return processings[0].process_rows(logits, sequences, trees.tokens, trees.ancestors)
    if same_processing(processings) is not None:
        return processings[0].process_rows(logits, sequences, trees.tokens, trees.row_ancestors())
    ancestors = trees.row_ancestors()
    return _stacked(
        [p.process(logits[b], sequences[b], trees.tokens[b], ancestors[b]) for b, p in enumerate(processings)]
    )


def _target_distribution(
    scores: torch.Tensor,
    processings: Sequence[NodeProcessing | None],
    plain: bool,
    sequences: RowSequences,
    compact: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distribution (B, N, V) sampling rows draw from, warped from the target's processed `scores` (B, N, V) as
    `generate` warps them, and whether each row's is in doubt ((B,) bool; None: no row's can be, see
    `NodeProcessing.distribution`)."""
    if plain:
        return scores.softmax(-1), None
    if isinstance(sequences, torch.Tensor):
        return processings[0].distribution_rows(scores, sequences, compact)
    distributions = [p.distribution(scores[b], sequences[b], compact) for b, p in enumerate(processings)]
    probs = _stacked([d[0] for d in distributions])
    doubts = [d[1] for d in distributions]
    doubt = None
    if any(d is not None for d in doubts):
        no = torch.zeros((), dtype=torch.bool, device=probs.device)
        doubt = _stacked([no if d is None else d for d in doubts])
    return probs, doubt


def _replace_row(accepted: Acceptance, b: int, again: Acceptance) -> None:
    """Row `b`'s verdict, emitted tokens and report in `accepted` replaced by those of `again`, its acceptance alone
    (a batch of one)."""
    verdict, depth = accepted.verdict, again.tokens.shape[1]
    verdict.path[b].zero_()
    verdict.path[b, :depth] = again.verdict.path[0]
    verdict.accepted[b] = again.verdict.accepted[0]
    verdict.bonus[b] = again.verdict.bonus[0]
    accepted.tokens[b, :depth] = again.tokens[0]
    accepted.reports[b] = again.reports[0]


def _stacked(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(parts)`, a view for one part."""
    return parts[0][None] if len(parts) == 1 else torch.stack(parts)


def _by_rule(sampling: torch.Tensor, sampled: Verdict, greedy: Verdict) -> Verdict:
    """Each row's verdict under its own rule: `sampled`'s where `sampling` (B,) says the row samples, else
    `greedy`'s."""
    doubt = None if sampled.doubt is None else sampled.doubt & sampling
    return Verdict(
        torch.where(sampling[:, None], sampled.path, greedy.path),
        torch.where(sampling, sampled.accepted, greedy.accepted),
        torch.where(sampling, sampled.bonus, greedy.bonus),
        doubt,
    )
