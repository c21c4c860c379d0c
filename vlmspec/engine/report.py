"""The end of a step on the device, and the one read that tells the host what it must know.

Acceptance leaves a `Verdict` on the device. From it, the tokens to emit (the accepted draft tokens, then the bonus
token), the first EOS among them and the token budget are settled on the device too; everything the host needs
(how many tokens to emit and which, whether to stop, the accepted path for the caches, the policy's statistics) is
packed into one tensor and read at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .accept import Verdict
from .choice import TargetSampler
from .counting import arange, host_values
from .tree import DraftTree, TreeRows


@dataclass
class StepReport:
    """One step as the host sees it, after its single read.

    `count` tokens of `tokens` are emitted (the accepted draft tokens, then the bonus token, cut after the first
    EOS and at the budget); `finished` says decoding stops; `doubt` that the verdict must be drawn again. `path`
    holds the accepted nodes from the root on. `statistics` are the policy's values; `tree_parents` and
    `tree_log_probs` the tree's, when asked for.
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


def emitted_tokens(tree: DraftTree, verdict: Verdict) -> torch.Tensor:
    """`(tree.depth + 1,)`: the accepted draft tokens, then the bonus token (what follows it is padding)."""
    return emitted_rows(tree.rows(), verdict.as_rows())[0]


def emitted_rows(trees: TreeRows, verdict: Verdict) -> torch.Tensor:
    """`emitted_tokens` of every row at once (B, depth + 1)."""
    bonus = verdict.bonus[:, None]
    tokens = torch.cat([trees.tokens.gather(1, verdict.path[:, 1:]), bonus], dim=1)
    return tokens.scatter(1, verdict.accepted[:, None], bonus)


@dataclass
class RowStep:
    """What accepting one sequence's step needs: the target's rule (`sampler`), the tree and the target's `logits`
    after each of its nodes, the sequence so far, what ends it (EOS ids, `room` tokens left), and what its policy
    reads (the draft's `greedy_depth`, its `statistics`, the tree itself when `with_tree`)."""

    sampler: TargetSampler
    tree: DraftTree
    logits: torch.Tensor
    sequence: torch.Tensor
    eos_token_ids: torch.Tensor
    room: int
    greedy_depth: torch.Tensor
    statistics: torch.Tensor | None = None
    with_tree: bool = False

    def accept(self, compact: bool = True) -> tuple[Verdict, torch.Tensor, PackedStep]:
        """Accept on the device (`compact`: see `TargetSampler.accept`): the verdict, the tokens emitted and the
        packed results, not yet read."""
        verdict = self.sampler.accept(self.tree, self.logits, self.sequence, compact)
        tokens = emitted_tokens(self.tree, verdict)
        step = pack_step(
            self.tree,
            verdict,
            tokens,
            self.eos_token_ids,
            self.room,
            self.greedy_depth,
            self.statistics,
            self.with_tree,
        )
        return verdict, tokens, step


def accept_rows(rows: list[RowStep]) -> list[tuple[Verdict, torch.Tensor, StepReport]]:
    """Accept every sequence's tree on the device and read all their results at once: per row its verdict, the tokens
    it emits and its report. Rows whose sampled verdict is in doubt are drawn again from the full rows (a second read,
    only then). One sequence is a batch of one."""
    results: list[Any] = [None] * len(rows)
    todo = list(range(len(rows)))
    for compact in (True, False):
        packed = []
        for b in todo:
            packed.append((b, *rows[b].accept(compact)))
        if len(packed) == 1:
            values = packed[0][3].values.tolist()
        else:
            device = rows[0].tree.tokens.device
            values = torch.cat([step.values.to(device) for *_, step in packed]).tolist()
        todo, offset = [], 0
        for b, verdict, tokens, step in packed:
            report = unpack_step(values[offset : offset + step.values.shape[0]], step)
            offset += step.values.shape[0]
            results[b] = (verdict, tokens, report)
            if report.doubt and compact:
                todo.append(b)
        if not todo:
            break
    return results


@dataclass
class PackedStep:
    """A step's results on the device as one float64 vector, and the sizes that cut it back into a `StepReport`."""

    values: torch.Tensor
    nodes: int
    depth: int
    statistics: int
    with_tree: bool


def pack_step(
    tree: DraftTree,
    verdict: Verdict,
    tokens: torch.Tensor,
    eos_token_ids: torch.Tensor,
    room: int,
    greedy_depth: torch.Tensor,
    statistics: torch.Tensor | None = None,
    with_tree: bool = False,
) -> PackedStep:
    """Settle EOS and the budget on the device and pack what the host must know (rows of a batch are packed apart,
    concatenated and read once)."""
    statistics = None if statistics is None else statistics[None]
    values = pack_rows(
        tree.rows(),
        verdict.as_rows(),
        tokens[None],
        eos_token_ids[None],
        [room],
        greedy_depth[None],
        statistics,
        with_tree,
    )
    return PackedStep(
        values[0], tree.size, tokens.shape[0], values.shape[1] - packed_width(tree, tokens, with_tree), with_tree
    )


def packed_width(tree: DraftTree | TreeRows, tokens: torch.Tensor, with_tree: bool) -> int:
    """How many values a row's packed step holds besides its statistics."""
    return 5 + 2 * tokens.shape[-1] + (2 * tree.size if with_tree else 0)


def pack_rows(
    trees: TreeRows,
    verdict: Verdict,
    tokens: torch.Tensor,
    eos_token_ids: torch.Tensor,
    rooms: list[int],
    greedy_depth: torch.Tensor,
    statistics: torch.Tensor | None = None,
    with_tree: bool = False,
) -> torch.Tensor:
    """`pack_step` of every row at once, a float64 `(B, values)` matrix read in one go: `tokens` (B, depth + 1) are
    each row's emitted tokens, `eos_token_ids` (B, E) its EOS ids (padded with -1), `rooms` its tokens left,
    `statistics` (B, s) its policy's values."""
    device = tokens.device
    rows = tokens.shape[0]
    offered = verdict.accepted + 1
    positions = arange(tokens.shape[1], device)
    is_eos = (tokens[:, :, None] == eos_token_ids[:, None, :]).any(-1) & (positions[None] < offered[:, None])
    hit = is_eos.any(1)
    count = torch.where(hit, is_eos.to(torch.uint8).argmax(1) + 1, offered)
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
    return torch.cat([whole] + [p.to(torch.float64) for p in parts], dim=1) if parts else whole


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
    )
