"""A step's acceptance of every row as `(B, N)` tensors: the acceptance rules' verdicts over the grown trees
(`GrownTrees`), the tokens each row emits, its first EOS, stop string and token budget settled on the device, and one
packed read that tells the host what it must know (how many tokens each row emits and which, whether it stops, the
accepted path for the caches, the policy's statistics). A fixed number of operations over all rows.

A row near its token budget drafts the same levels as the others; its nodes past what the budget allows are
invalid (never accepted), and a row with its own generator draws only its valid nodes' uniforms, so it decodes as
it would alone. Rows that share their rule and a processing whose sequence processors read a sequence as a set of
ids (none, or the released configs' repetition penalty with any warpers) are scored, accepted and packed by one
function of tensors (`scored_step`), one compiled region where the pair runs compiled, its random numbers drawn
before it; other rows process their logits row by row (the processors see each node's own sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from ..device_tensors import arange, host_values, trues
from .accept import SamplingNoise, Verdict, accept_greedy_rows, accept_sampled_rows, sampled_verdict, sampling_noise
from .compiled import Captured, GuardedRunner
from .draft import GrownTrees
from .processing import (
    NodeProcessing,
    RowSequences,
    TargetSampler,
    batched_processing,
    same_processing,
    uniform_processing,
)
from .relaxed import RelaxedRows, accept_relaxed_rows
from .stopping import StringCheck
from .tree import Tree, Trees

if TYPE_CHECKING:
    from ..policies import TreePolicy


@dataclass
class Acceptance:
    """A step's acceptance of every row: the verdicts (batched), the tokens each row emits (B, depth + 1) and each
    row's report, read once."""

    verdict: Verdict
    tokens: torch.Tensor
    reports: list[StepReport]


@dataclass
class StepStatistics:
    """What a step's policy reads of the draft's root distribution and of the grown trees (`TreePolicy.statistics`
    of `root_log_probs` (B, V), then `TreePolicy.path_statistics` of `trees`), taken where the step's acceptance
    runs: inside its compiled region where it has one."""

    policy: TreePolicy
    root_log_probs: torch.Tensor
    trees: Trees

    def values(self) -> torch.Tensor | None:
        """The policy's values (B, s), or None."""
        root, path = self.policy.statistics(self.root_log_probs), self.policy.path_statistics(self.trees)
        if root is None or path is None:
            return path if root is None else root
        return torch.cat([root, path.to(root.device)], dim=1)


@dataclass
class TargetScoring:
    """How one compiled region (`scored_step`) turns the target's logits into every row's choices, where all rows share
    it: their config's `processing` (None: none; else one whose sequence processors read a sequence as a set of ids,
    `NodeProcessing.batches_rows`), the rows' tokens so far `sequences` (B, T) it reads (None where nothing does),
    whether the rows `sample`, whether a sampled top-k's later warpers run on its columns (`compact`), and the greedy
    rows' relaxed rules (`relaxed`; None: every row exact)."""

    processing: NodeProcessing | None
    sequences: torch.Tensor | None
    sample: bool
    compact: bool
    relaxed: RelaxedRows | None = None

    @staticmethod
    def shared(samplers: Sequence[TargetSampler], sequences: RowSequences, compact: bool) -> TargetScoring | None:
        """The scoring every row of `samplers` shares, with their `sequences`; None where rows differ (in rule or
        processing) or their processors read more of a sequence than its ids."""
        rules = {s.do_sample for s in samplers}
        batched = batched_processing([s.processing for s in samplers], sequences)
        if len(rules) > 1 or batched is None:
            return None
        return TargetScoring(*batched, rules.pop(), compact)


def accept_trees(
    drafted: GrownTrees,
    trees: Trees,
    logits: torch.Tensor,
    samplers: Sequence[TargetSampler],
    sequences: RowSequences,
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    statistics: StepStatistics | torch.Tensor | None,
    with_tree: bool,
    strings: StringCheck | None = None,
    compact: bool = True,
    capture: GuardedRunner | None = None,
    relaxed: RelaxedRows | None = None,
) -> Acceptance:
    """Accept every row's tree from the target's `logits` (B, N, V) and read all rows' results at once. Greedy rows
    take the target's choices, sampling rows recursive rejection (rows of both rules in one batch are accepted both
    ways, each keeping its own); a sampled row whose verdict is in doubt (see `NodeProcessing.distribution`,
    `compact`) is accepted again alone from its full rows (a second read, only then). `trees` are `drafted.trees`
    where the target's logits are; `strings` checks the rows' stop strings after each emitted token (None: no row has
    any). One sequence is a batch of one. With `capture` (the target's runner), rows that share their rule and
    processing (`TargetScoring`) and have no stop strings are accepted in one compiled region where the pair runs
    compiled (`scored_step`), the policy's `statistics` taken in it, the random numbers drawn before it; eager, the
    same function serves greedy rows without processing. `relaxed`: the rows' relaxed rules (None: all exact)."""
    # A tree of its root alone (a plain step) warps its rows whole, as `generate` does: nothing to compact or doubt.
    compact = compact and trees.size > 1
    scoring = None if strings is not None or capture is None else TargetScoring.shared(samplers, sequences, compact)
    if scoring is not None and not capture.captures and (scoring.sample or scoring.processing is not None):
        scoring = None  # eager, the rules' own path is leaner (a plain step packs one token from a template)
    if scoring is not None:
        scoring = replace(scoring, relaxed=relaxed)
        made = (drafted, trees, logits, samplers, eos_token_ids, rooms, statistics, with_tree)
        trees, verdict, tokens, packed = _accept_scored(capture, scoring, *made)
    else:
        if isinstance(statistics, StepStatistics):
            statistics = statistics.values()
        verdict = _verdict(trees, logits, samplers, sequences, drafted.sizes, compact, relaxed)
        tokens = emitted_rows(trees, verdict)
        stops = None if strings is None else strings.hits(tokens)
        step = (trees, verdict, tokens, eos_token_ids, rooms, drafted.greedy_depth, statistics, with_tree, stops)
        packed = pack_rows(*step)
    differing = verdict.differs is not None
    accepted = Acceptance(verdict, tokens, read_rows(packed, trees, tokens, with_tree, drafted.sizes, differing))
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
                None,
                with_tree,
                None if strings is None else strings.row(b),
                compact=False,
            )
            _replace_row(accepted, b, again)
    return accepted


def _accept_scored(
    capture: GuardedRunner,
    scoring: TargetScoring,
    drafted: GrownTrees,
    trees: Trees,
    logits: torch.Tensor,
    samplers: Sequence[TargetSampler],
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    statistics: StepStatistics | torch.Tensor | None,
    with_tree: bool,
) -> tuple[Trees, Verdict, torch.Tensor, torch.Tensor]:
    """`scored_step` of every row (one compiled region where `capture` runs compiled), its noise drawn first: the
    trees as it took them, the verdict, the emitted tokens and the packed rows."""
    noise = _noise(trees, logits, samplers, drafted.sizes) if scoring.sample else None
    room = host_values(rooms, trees.tokens.device)
    if capture.captures and trees.size > 1:
        trees = _one_graph_form(trees)
    step = (trees, logits, scoring, noise, eos_token_ids, room, drafted.greedy_depth, statistics, with_tree)
    return trees, *SCORED_STEP(capture, *step)


def _own_generators(samplers: Sequence[TargetSampler]) -> list[torch.Generator | None] | None:
    """Each row's own generator, or None where every row draws from the global RNG (then all at once)."""
    generators = [s.generator for s in samplers]
    return None if all(g is None for g in generators) else generators


def _one_graph_form(trees: Trees) -> Trees:
    """`trees` as the compiled acceptance takes them, so that one graph serves every tree: an all-True `valid` (a kept
    tensor) where all nodes are valid, as capped trees carry one; and at least two levels, since dynamo specialises a
    depth of 1 (the extra level has no node: its path entry is 0, past what is accepted, as any shallow row's)."""
    valid = trees.valid if trees.valid is not None else trues(*trees.tokens.shape, trees.tokens.device)
    return replace(trees, valid=valid, depth=max(trees.depth, 2))


def _noise(trees: Trees, logits: torch.Tensor, samplers: Sequence[TargetSampler], sizes: list[int]) -> SamplingNoise:
    """The random numbers the rows' sampled acceptance consumes (`SamplingNoise`), drawn from the global RNG or each
    row's own generator, before the step's compiled region."""
    rows, n, vocab = logits.shape
    own = _own_generators(samplers)
    return sampling_noise(rows, n, vocab, own, sizes, logits.device)


def _verdict(
    trees: Trees,
    logits: torch.Tensor,
    samplers: Sequence[TargetSampler],
    sequences: RowSequences,
    sizes: list[int],
    compact: bool,
    relaxed: RelaxedRows | None = None,
) -> Verdict:
    """Every row's verdict on its tree, eager: greedy rows take the target's choices under their processing (or their
    `relaxed` rules), sampling rows recursive rejection (a batch of both is accepted both ways, each row keeping its
    own)."""
    rules = [s.do_sample for s in samplers]
    processings = [s.processing for s in samplers]
    plain = uniform_processing(processings)
    scores = _target_scores(logits, trees, processings, plain, sequences)
    greedy = None if all(rules) else _greedy_verdict(trees, scores, relaxed)
    if not any(rules):
        return greedy
    probs, doubt = _target_distribution(scores, processings, plain, sequences, compact)
    own = _own_generators(samplers)
    verdict = accept_sampled_rows(trees, probs, own, sizes)
    verdict.doubt = doubt
    if greedy is not None:
        verdict = _by_rule(host_values(rules, trees.tokens.device).bool(), verdict, greedy)
    return verdict


def scored_step(
    trees: Trees,
    logits: torch.Tensor,
    scoring: TargetScoring,
    noise: SamplingNoise | None,
    eos_token_ids: torch.Tensor,
    rooms: torch.Tensor,
    greedy_depth: torch.Tensor,
    statistics: StepStatistics | torch.Tensor | None,
    with_tree: bool,
) -> tuple[Verdict, torch.Tensor, torch.Tensor]:
    """Every row's acceptance of its tree from the target's `logits` (B, N, V) under the `scoring` all rows share,
    without stop strings, as a pure function of tensors: the scores under the config's processing, then greedy
    acceptance or recursive rejection (by `noise`, drawn before), the emitted tokens (B, depth + 1) and the packed rows
    (`pack_rows`; `rooms` (B,) each row's tokens left; the policy's `statistics` taken here)."""
    if isinstance(statistics, StepStatistics):
        statistics = statistics.values()
    processing, sequences = scoring.processing, scoring.sequences
    if processing is None:
        scores = logits.float()
    else:
        scores = processing.process_rows(logits, sequences, trees.tokens, trees.ancestors)
    if scoring.sample:
        if processing is None:
            probs, doubt = scores.softmax(-1), None
        else:
            probs, doubt = processing.distribution_rows(scores, sequences, scoring.compact)
        verdict = sampled_verdict(trees, probs, noise)
        verdict.doubt = doubt
    else:
        verdict = _greedy_verdict(trees, scores, scoring.relaxed)
    tokens = emitted_rows(trees, verdict)
    return verdict, tokens, pack_rows(trees, verdict, tokens, eos_token_ids, rooms, greedy_depth, statistics, with_tree)


def _greedy_verdict(trees: Trees, scores: torch.Tensor, relaxed: RelaxedRows | None) -> Verdict:
    """Greedy rows' verdict from the target's processed `scores` (B, N, V): the target's choices, or where some row
    verifies relaxed, every row under its own rule (`accept_relaxed_rows`)."""
    if relaxed is None:
        return accept_greedy_rows(trees, scores.argmax(-1))
    return accept_relaxed_rows(trees, scores, relaxed)


#: `scored_step` as one compiled region while the pair runs compiled.
SCORED_STEP = Captured(scored_step, "acceptance")


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
    if verdict.differs is not None:  # a sampled row, which is never relaxed
        verdict.differs[b] = False
    accepted.tokens[b, :depth] = again.tokens[0]
    # The policy's statistics read the draft's root alone, whatever the verdict: the row keeps its first report's.
    accepted.reports[b] = replace(again.reports[0], statistics=accepted.reports[b].statistics)


def _stacked(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(parts)`, a view for one part."""
    return parts[0][None] if len(parts) == 1 else torch.stack(parts)


def _by_rule(sampling: torch.Tensor, sampled: Verdict, greedy: Verdict) -> Verdict:
    """Each row's verdict under its own rule: `sampled`'s where `sampling` (B,) says the row samples, else
    `greedy`'s."""
    doubt = None if sampled.doubt is None else sampled.doubt & sampling
    differs = None if greedy.differs is None else greedy.differs & ~sampling[:, None]
    return Verdict(
        torch.where(sampling[:, None], sampled.path, greedy.path),
        torch.where(sampling, sampled.accepted, greedy.accepted),
        torch.where(sampling, sampled.bonus, greedy.bonus),
        doubt,
        differs,
    )


@dataclass
class StepReport:
    """One step as the host sees it, after its single read.

    `count` tokens of `tokens` are emitted (the accepted draft tokens, then the bonus token, cut after the first
    EOS and at the budget); `finished` says decoding stops; `doubt` that the verdict must be drawn again. `path`
    holds the accepted nodes from the root on. `statistics` are the policy's values; `tree_parents` and
    `tree_log_probs` the tree's, when asked for. `differing` counts the emitted tokens that are not the target's own
    choice (relaxed verification alone makes any).
    """

    accepted: int
    count: int
    finished: bool
    doubt: bool
    greedy_depth: int
    tokens: list[int]
    path: list[int]
    statistics: list[float]
    tree_parents: list[int] | None = None
    tree_log_probs: list[float] | None = None
    differing: int = 0


def emitted_rows(trees: Trees, verdict: Verdict) -> torch.Tensor:
    """Every row's emitted tokens (B, depth + 1): the accepted draft tokens, then the bonus token (what follows it is
    padding)."""
    bonus = verdict.bonus[:, None]
    if verdict.path.shape[1] == 1:  # nothing drafted (a plain step)
        return bonus
    tokens = torch.cat([trees.tokens.gather(1, verdict.path[:, 1:]), bonus], dim=1)
    return tokens.scatter(1, verdict.accepted[:, None], bonus)


@dataclass
class PackedStep:
    """A step's results on the device as one float64 vector, and the sizes that cut it back into a `StepReport`
    (`differing`: whether its last value counts the emitted tokens that differ from the target's choice)."""

    values: torch.Tensor
    nodes: int
    depth: int
    statistics: int
    with_tree: bool
    differing: bool = False


def read_rows(
    packed: torch.Tensor,
    trees: Trees,
    tokens: torch.Tensor,
    with_tree: bool,
    sizes: list[int] | None = None,
    differing: bool = False,
) -> list[StepReport]:
    """Read a step's packed rows (`pack_rows`) once and cut each into its `StepReport`; `sizes` are the rows' own
    node counts when their trees are padded (all `trees.size` by default); `differing` says the verdict marked the
    tokens that differ from the target's choice (relaxed verification), counted in the rows' last value."""
    values = packed.tolist()
    width = packed_width(trees, tokens, with_tree) + differing
    layout = PackedStep(packed[0], trees.size, tokens.shape[1], packed.shape[1] - width, with_tree, differing)
    return [unpack_step(row, layout, None if sizes is None else sizes[b]) for b, row in enumerate(values)]


def packed_width(tree: Tree | Trees, tokens: torch.Tensor, with_tree: bool) -> int:
    """How many values a row's packed step holds besides its statistics."""
    return 5 + 2 * tokens.shape[-1] + (2 * tree.size if with_tree else 0)


def pack_rows(
    trees: Trees,
    verdict: Verdict,
    tokens: torch.Tensor,
    eos_token_ids: torch.Tensor,
    rooms: list[int] | torch.Tensor,
    greedy_depth: torch.Tensor,
    statistics: torch.Tensor | None = None,
    with_tree: bool = False,
    stops: torch.Tensor | None = None,
) -> torch.Tensor:
    """Settle EOS, stop strings and the budget on the device and pack what the host must know of every row, a float64
    `(B, values)` matrix read in one go (`read_rows`): `tokens` (B, depth + 1) are each row's emitted tokens,
    `eos_token_ids` (B, E) its EOS ids (padded with -1), `rooms` its tokens left (a list, or a (B,) tensor),
    `statistics` (B, s) its policy's values, `stops` (B, depth + 1) whether a stop string ends right after each token
    (None: no row has any)."""
    device = tokens.device
    rows = tokens.shape[0]
    if tokens.shape[1] == 1 and statistics is None and not with_tree and isinstance(rooms, list):
        return _pack_one_token(verdict, tokens, eos_token_ids, rooms, stops)
    offered = verdict.accepted + 1
    positions = arange(tokens.shape[1], device)
    ends = (tokens[:, :, None] == eos_token_ids[:, None, :]).any(-1)
    if stops is not None:
        ends = ends | stops
    ends = ends & (positions[None] < offered[:, None])
    hit = ends.any(1)
    count = torch.where(hit, ends.to(torch.int32).argmax(1) + 1, offered)  # int32: see `deepest_rows`
    if isinstance(rooms, torch.Tensor):
        room = rooms
    else:
        room = rooms[0] if rows == 1 else host_values(rooms, device)
    finished = hit | (count >= room)
    flags = finished.long()[:, None] if verdict.doubt is None else torch.stack([finished, verdict.doubt], 1).long()
    head = [verdict.accepted[:, None], count.clamp_max(room)[:, None], flags]
    if verdict.doubt is None:
        head.append(torch.zeros_like(flags))
    head.append(greedy_depth.to(device).long()[:, None])
    whole = torch.cat(head + [tokens, verdict.path], dim=1).to(torch.float64)
    parts = [] if statistics is None else [statistics.to(device)]
    if with_tree:
        parts += [trees.row_parents(), trees.log_probs]
    if verdict.differs is not None:  # relaxed verification: the emitted tokens that are not the target's choice
        parts.append((verdict.differs & (positions[None] < count.clamp_max(room)[:, None])).sum(1, keepdim=True))
    return torch.cat([whole] + [p.to(torch.float64) for p in parts], dim=1) if parts else whole


def _pack_one_token(
    verdict: Verdict,
    tokens: torch.Tensor,
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    stops: torch.Tensor | None,
) -> torch.Tensor:
    """`pack_rows` of a step that drafted nothing (each row emits its one token `tokens` (B, 1)): the same layout,
    with what is known on the host (nothing accepted, one token emitted, which rows reach their budget) written from
    a kept template rather than computed, as `generate`'s step checks only its token against EOS and the budget."""
    rows, device = tokens.shape[0], tokens.device
    ends = (tokens == eos_token_ids).any(1)
    if stops is not None:
        ends = ends | stops[:, 0]
    if min(rooms) <= 1:
        ends = ends | host_values([room <= 1 for room in rooms], device, torch.bool)
    packed = _one_token_rows(rows, device).clone()
    packed[:, 2] = ends
    if verdict.doubt is not None:
        packed[:, 3] = verdict.doubt
    packed[:, 5] = tokens[:, 0]
    return packed


#: Per device, rows of a packed one-token step as far as the host knows them (see `_one_token_rows`).
_ONE_TOKEN: dict[torch.device, torch.Tensor] = {}


def _one_token_rows(rows: int, device: torch.device) -> torch.Tensor:
    """`rows` packed one-token steps as far as the host knows them: accepted 0, count 1, not finished, no doubt,
    greedy depth 0, token 0, path [0] (a view of one kept tensor, grown as batches grow: never write into it)."""
    device = torch.device(device)
    held = _ONE_TOKEN.get(device)
    if held is None or held.shape[0] < rows:
        held = torch.zeros(max(rows, 64), 7, dtype=torch.float64, device=device)
        held[:, 1] = 1.0
        _ONE_TOKEN[device] = held
    return held[:rows]


def unpack_step(values: list[float], packed: PackedStep, nodes: int | None = None) -> StepReport:
    """The `StepReport` of a packed step, from its values as read; a padded tree's first `nodes` are its own."""
    n, depth, stats = packed.nodes, packed.depth, packed.statistics
    own = n if nodes is None else nodes
    head, values = values[:5], values[5:]
    tokens_host, path, values = values[:depth], values[depth : 2 * depth], values[2 * depth :]
    accepted = int(head[0])
    return StepReport(
        accepted=accepted,
        count=int(head[1]),
        finished=bool(head[2]),
        doubt=bool(head[3]),
        greedy_depth=int(head[4]),
        tokens=[int(t) for t in tokens_host],
        path=[int(i) for i in path[: accepted + 1]],
        statistics=values[:stats],
        tree_parents=[int(i) for i in values[stats : stats + own]] if packed.with_tree else None,
        tree_log_probs=values[stats + n : stats + n + own] if packed.with_tree else None,
        differing=int(values[-1]) if packed.differing else 0,
    )
