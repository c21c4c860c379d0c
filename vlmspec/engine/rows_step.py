"""One step of many sequences as `(B, N)` tensors, when every row drafts the same tree of rank paths (a chain, a
static tree): drafting a level, verification, acceptance and the commit each run as a fixed number of operations
over all rows, and the step's results are read once for all rows.

A row near its token budget drafts the same levels as the others; its nodes past what the budget allows are
invalid (never accepted), and a row with its own generator draws only its valid nodes' uniforms, so it decodes as
it would alone. Rows whose generation config has logits processors process their logits row by row (the
processors see each node's own sequence); without processors nothing here loops over rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .accept import Verdict, accept_greedy_rows, accept_sampled_rows
from .choice import NodeProcessing, TargetSampler
from .counting import arange, host_values
from .draft import Drafted, proposal_log_probs, proposal_log_probs_rows
from .report import StepReport, emitted_rows, pack_rows, read_rows
from .row_runner import RowRunner
from .tree import TreeRows, TreeShape


@dataclass
class RowsDrafted:
    """Every row's tree of a step, the draft's root log-probabilities (B, V), how many levels of each row's tree the
    draft cache holds, each row's greedy depth (B,) and valid nodes (`sizes`, host), and the draft forwards and
    tokens fed (padding included)."""

    trees: TreeRows
    root_log_probs: torch.Tensor
    cached_depths: list[int]
    greedy_depth: torch.Tensor
    sizes: list[int]
    depths: list[int]
    forwards: int
    fed_tokens: int

    def row(self, b: int) -> Drafted:
        """Row `b`'s tree cut to its valid nodes, as the one-row drafter would have grown it (views)."""
        tree = self.trees.row(b, self.sizes[b], self.depths[b])
        return Drafted(
            tree, self.root_log_probs[b], self.cached_depths[b], self.greedy_depth[b], self.forwards, self.fed_tokens
        )

    @staticmethod
    def one(grown: Drafted) -> RowsDrafted:
        """One tree as a batch of one (views)."""
        return RowsDrafted(
            grown.tree.rows(),
            grown.root_log_probs[None],
            [grown.cached_depth],
            grown.greedy_depth[None],
            [grown.tree.size],
            [grown.tree.depth],
            grown.forwards,
            grown.fed_tokens,
        )

    @staticmethod
    def stacked(grown: Sequence[Drafted], device: torch.device, forwards: int, fed_tokens: int) -> RowsDrafted:
        """Trees grown row by row (of different shapes) as rows of their own structure on `device`, padded to the
        largest."""
        trees = TreeRows.padded([d.tree.to(device) for d in grown])
        return RowsDrafted(
            trees,
            torch.stack([d.root_log_probs for d in grown]),
            [d.cached_depth for d in grown],
            torch.stack([d.greedy_depth for d in grown]).to(device),
            [d.tree.size for d in grown],
            [d.tree.depth for d in grown],
            forwards,
            fed_tokens,
        )


#: Each row's tokens so far: one `(B, T)` tensor (each row padded with its own last token) when the rows share a
#: processing, else a list of each row's `(1, T_b)` (None where nothing reads it).
RowSequences = torch.Tensor | Sequence[torch.Tensor | None]


def uniform_processing(processings: Sequence[NodeProcessing | None]) -> bool:
    """Whether no row processes its logits (so every row's log-probabilities come from one batched operation)."""
    return all(p is None or not (p.sequence_processors or p.warpers) for p in processings)


def common_processing(processings: Sequence[NodeProcessing | None]) -> NodeProcessing | None:
    """The processing every row's equals, when one call can serve all rows (its sequence processors read a sequence
    as a set of ids); None when rows differ or none can."""
    first = processings[0]
    if first is None or not first.batches_rows:
        return None
    if all(p is first or (p is not None and p.key == first.key) for p in processings):
        return first
    return None


def draft_rows(
    draft: RowRunner,
    shape: TreeShape,
    top_k: int,
    pending: torch.Tensor,
    counts: list[int],
    max_depths: list[int],
    vocab_limit: int,
    input_limit: int,
    processings: Sequence[NodeProcessing | None],
    sequences: RowSequences,
) -> RowsDrafted:
    """Grow every row's tree of `shape` with one draft forward per level over all rows.

    `pending` (B, P) holds each row's emitted tokens the draft has not seen (its first `counts[b]`, the last of them
    the row's root); row b grows at most `max_depths[b]` levels (its budget), the others' deeper nodes invalid.
    `processings` and `sequences` are each row's config processing for the draft (None: none) and tokens so far
    (needed only where a row processes its logits).
    """
    device = pending.device
    rows = pending.shape[0]
    depth = min(shape.depth, max(max_depths))
    n = shape.level_ends[depth]
    last = host_values([c - 1 for c in counts], device)
    start = draft.positions(host_values(draft.lengths, device))
    fed = pending.clamp_max(input_limit - 1)
    logits = draft.forward_rows(fed, arange(fed.shape[1], device), start, None, counts)
    root_logits = logits.gather(1, last[:, None, None].expand(rows, 1, logits.shape[2]))[:, 0]
    plain = uniform_processing(processings)
    tokens = torch.empty(rows, n, dtype=torch.long, device=device)
    log_probs = torch.zeros(rows, n, device=device)
    tokens[:, 0] = pending.gather(1, last[:, None])[:, 0]
    root_log_probs, root_order = _log_probs(root_logits[:, None], plain, processings, sequences, vocab_limit)
    child_log_probs, child_order = root_log_probs, root_order
    root_position = start + last
    cached_depth, forwards, fed_tokens = 0, 1, rows * fed.shape[1]
    for level in range(1, depth + 1):
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
        if level == depth:
            break
        visible = shape.block(new, slice(1, new.stop))
        logits = draft.forward_rows(tokens[:, new], shape.depths[new], root_position, visible)
        forwards, fed_tokens = forwards + 1, fed_tokens + rows * (new.stop - new.start)
        ancestors = shape.ancestors[new, : new.stop]
        child_log_probs, child_order = _log_probs(
            logits, plain, processings, sequences, vocab_limit, tokens[:, : new.stop], ancestors
        )
        cached_depth = level
    row_depths = [min(depth, d) for d in max_depths]
    valid = None
    if min(row_depths) < depth:
        valid = shape.depths[None, :n] <= host_values(row_depths, device)[:, None]
    trees = TreeRows(tokens, log_probs, shape.parents[:n], shape.depths[:n], shape.ancestors[:n, :n], depth, valid)
    if valid is None:
        greedy_depth = shape.greedy_depth(n).expand(rows)
    else:
        greedy_depth = (shape.greedy_path[None, :n] * valid).amax(dim=1)
    sizes = [shape.level_ends[d] for d in row_depths]
    cached = [cached_depth] * rows
    return RowsDrafted(trees, root_log_probs[:, 0], cached, greedy_depth, sizes, row_depths, forwards, fed_tokens)


def _log_probs(
    logits: torch.Tensor,
    plain: bool,
    processings: Sequence[NodeProcessing | None],
    sequences: RowSequences,
    vocab_limit: int,
    tokens: torch.Tensor | None = None,
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's proposal log-probabilities and ranking key (B, m, V) from the draft's `logits` (B, m, V): at once
    when no row processes its logits or all share one processing (`sequences` a tensor), else row by row."""
    if plain:
        return proposal_log_probs_rows(logits, None, vocab_limit, sequences)
    if isinstance(sequences, torch.Tensor):
        return proposal_log_probs_rows(logits, processings[0], vocab_limit, sequences, tokens, ancestors)
    parts = [
        proposal_log_probs(
            logits[b], processing, vocab_limit, sequences[b], None if tokens is None else tokens[b], ancestors
        )
        for b, processing in enumerate(processings)
    ]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


@dataclass
class RowsVerdict:
    """A step's acceptance of every row: the verdicts (batched), the tokens each row emits (B, depth + 1) and each
    row's report, read once."""

    verdict: Verdict
    tokens: torch.Tensor
    reports: list[StepReport]


def accept_all(
    drafted: RowsDrafted,
    trees: TreeRows,
    logits: torch.Tensor,
    samplers: Sequence[TargetSampler],
    sequences: RowSequences,
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    statistics: torch.Tensor | None,
    with_tree: bool,
    compact: bool = True,
) -> RowsVerdict:
    """Accept every row's tree from the target's `logits` (B, N, V) and read all rows' results at once. Greedy rows
    take the target's choices, sampling rows recursive rejection (rows of both rules in one batch are accepted both
    ways, each keeping its own); a sampled row whose verdict is in doubt (see `NodeProcessing.distribution`,
    `compact`) is accepted again alone from its full rows (a second read, only then). `trees` are `drafted.trees`
    where the target's logits are. One sequence is a batch of one."""
    rules = [s.do_sample for s in samplers]
    processings = [s.processing for s in samplers]
    plain = uniform_processing(processings)
    if plain:
        scores = logits.float()
    elif isinstance(sequences, torch.Tensor):
        scores = processings[0].process_rows(logits, sequences, trees.tokens, trees.ancestors)
    else:
        ancestors = trees.row_ancestors()
        scores = _stacked(
            [p.process(logits[b], sequences[b], trees.tokens[b], ancestors[b]) for b, p in enumerate(processings)]
        )
    greedy = None if all(rules) else accept_greedy_rows(trees, scores.argmax(-1))
    verdict = greedy
    if any(rules):
        if plain:
            probs, doubt = scores.softmax(-1), None
        elif isinstance(sequences, torch.Tensor):
            probs, doubt = processings[0].distribution_rows(scores, sequences, compact)
        else:
            distributions = [p.distribution(scores[b], sequences[b], compact) for b, p in enumerate(processings)]
            probs = _stacked([d[0] for d in distributions])
            doubt = _stacked([d[1] for d in distributions])
        generators = [s.generator for s in samplers]
        own = None if all(g is None for g in generators) else generators
        verdict = accept_sampled_rows(trees, probs, own, drafted.sizes)
        verdict.doubt = doubt
        if greedy is not None:
            verdict = _by_rule(host_values(rules, trees.tokens.device).bool(), verdict, greedy)
    tokens = emitted_rows(trees, verdict)
    packed = pack_rows(trees, verdict, tokens, eos_token_ids, rooms, drafted.greedy_depth, statistics, with_tree)
    reports = read_rows(packed, trees, tokens, with_tree, drafted.sizes)
    for b, report in enumerate(reports):
        if report.doubt:
            again = accept_all(
                RowsDrafted.one(drafted.row(b)),
                trees.row(b, drafted.sizes[b], drafted.depths[b]).rows(),
                logits[b : b + 1, : drafted.sizes[b]],
                samplers[b : b + 1],
                sequences[b : b + 1],
                eos_token_ids[b : b + 1],
                rooms[b : b + 1],
                None if statistics is None else statistics[b : b + 1],
                with_tree,
                compact=False,
            )
            depth = again.tokens.shape[1]
            verdict.path[b].zero_()
            verdict.path[b, :depth] = again.verdict.path[0]
            verdict.accepted[b] = again.verdict.accepted[0]
            verdict.bonus[b] = again.verdict.bonus[0]
            tokens[b, :depth] = again.tokens[0]
            reports[b] = again.reports[0]
    return RowsVerdict(verdict, tokens, reports)


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
