"""Acceptance rules: which path of a verified tree is emitted, and the target's bonus token after it.

Both rules work on the whole tree at once (a few (n,) and (n, n) tensor operations), never on the vocabulary in
a Python loop, and leave their verdict on the device: nothing here waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..device_tensors import arange, zeros
from .tree import Trees


@dataclass
class Verdict:
    """What a rule accepted, as device tensors of fixed shape; for a batch of trees (`Trees`), each with a leading
    row dimension.

    `path` (depth + 1,) holds the accepted node at each depth from the root on; entries past `accepted` are 0.
    `accepted` () is how many draft tokens were accepted, `bonus` () the target's token after them. `doubt` (), set
    by a sampler, says the distribution drawn from may differ from `generate`'s (see `NodeProcessing`).
    """

    path: torch.Tensor
    accepted: torch.Tensor
    bonus: torch.Tensor
    doubt: torch.Tensor | None = None

    def as_rows(self) -> Verdict:
        """One tree's verdict as a batch of one (views)."""
        return Verdict(
            self.path[None], self.accepted[None], self.bonus[None], None if self.doubt is None else self.doubt[None]
        )

    def row(self, b: int) -> Verdict:
        """Row `b`'s verdict of a batch's (views)."""
        return Verdict(self.path[b], self.accepted[b], self.bonus[b], None if self.doubt is None else self.doubt[b])


def accept_greedy_rows(trees: Trees, target_choice: torch.Tensor) -> Verdict:
    """In every row, the deepest node whose whole path equals the target's choices, and the target's choice after it:
    `target_choice` (B, N) is the target's token after each node.

    Siblings carry distinct tokens, so at most one node per depth can agree with the target. Trees of their root
    alone (a plain step) take the target's choice after it, with nothing to compare.
    """
    if trees.size == 1:
        nothing = zeros(trees.tokens.shape[0], trees.tokens.device)
        return Verdict(nothing[:, None], nothing, target_choice[:, 0])
    matches = trees.tokens == target_choice.gather(1, trees.row_parents().clamp_min(0))
    matches[:, 0] = True
    if trees.valid is not None:
        matches &= trees.valid
    path, accepted, best = deepest_rows(trees, matches)
    return Verdict(path, accepted, target_choice.gather(1, best[:, None])[:, 0])


def accept_sampled_rows(
    trees: Trees,
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None] | None = None,
    sizes: Sequence[int] | None = None,
) -> Verdict:
    """Recursive rejection over each node's children, in draft rank order: every row's accepted path and bonus token.

    `probs` (B, N, V) is each row's target distribution p (processed) after each of its nodes. At a node, child x_j
    is accepted with probability p'_j(x_j), where p'_j is p with the already rejected x_1..x_{j-1} removed and
    renormalised; an accepted child is descended into; when every child is rejected the bonus token is drawn from p'
    without them.
    Exactness: (1) x_j is accepted with prod_{i<j} (1 - p'_i(x_i)) p'_j(x_j) = p(x_j), the product telescoping
    since 1 - p'_i(x_i) = (1 - P_{i+1}) / (1 - P_i) with P_i = sum_{l<i} p(x_l); (2) all are rejected with
    probability 1 - P_{k+1}, and a token t outside the children is then drawn with p(t) / (1 - P_{k+1}), so with
    p(t) in all; (3) every token after the node thus follows p, and the chain rule over the path gives the target's
    distribution of the whole emitted sequence, whatever tree the draft proposed.

    One uniform u per node realises all of its trials at once: x_j is accepted when P_j <= u < P_j + p(x_j), which
    has the probabilities of (1); all children are rejected when u >= P_{k+1}. Children are deterministic (the
    draft's top ranks), so no draft probability enters the rule.

    Invalid nodes (`trees.valid`) are not children at all: their mass stays with the bonus draw. Without
    `generators` all rows draw from the global RNG together; with them, row b draws its uniforms (the first
    `sizes[b]` nodes', its valid ones) and its bonus token from `generators[b]`, as its tree alone would.
    """
    rows, n, vocab = probs.shape
    if n == 1:
        # The root alone (a plain step): the bonus token is drawn from p itself. The node's uniform is drawn as a
        # one-node tree draws it, so a seeded row's stream is the same whether or not other rows drafted.
        _uniform_rows(rows, 1, generators, sizes, probs.device)
        nothing = zeros(rows, probs.device)
        return Verdict(nothing[:, None], nothing, draw_rows(probs[:, 0], generators))
    parents, children = trees.row_parents()[:, 1:], trees.tokens[:, 1:]
    flat = probs.reshape(rows, n * vocab)
    index = parents * vocab + children
    full_mass = flat.gather(1, index)
    child_mass = full_mass if trees.valid is None else full_mass * trees.valid[:, 1:]
    earlier_sibling = (parents[:, :, None] == parents[:, None, :]).tril(-1)
    before = torch.where(earlier_sibling, child_mass[:, None, :], 0.0).sum(-1)
    rest = flat.scatter(1, index, full_mass - child_mass).view(rows, n, vocab)
    total = rest.sum(-1).scatter_add(1, parents, child_mass)
    u = (_uniform_rows(rows, n, generators, sizes, probs.device) * total).gather(1, parents)
    accepted = torch.ones(rows, n, dtype=torch.bool, device=probs.device)
    accepted[:, 1:] = (u >= before) & (u < before + child_mass)
    path, count, last = deepest_rows(trees, accepted)
    at_last = last[:, None, None].expand(rows, 1, vocab)
    bonus_weights = rest.gather(1, at_last)[:, 0]
    # Children covering the whole support leave no gap in exact arithmetic; a rounding one gets p itself.
    bonus_weights = torch.where(bonus_weights.sum(-1, keepdim=True) > 0, bonus_weights, probs.gather(1, at_last)[:, 0])
    return Verdict(path, count, draw_rows(bonus_weights, generators))


def deepest_rows(trees: Trees, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """In every row of `accepted` (B, N), the deepest node all of whose path nodes are accepted (the first such, in
    node order): its path by depth (B, depth + 1) (0 past its depth), its depth and its index (B,), on the device."""
    ancestors, depths = trees.row_ancestors(), trees.row_depths()
    valid = ~(ancestors & ~accepted[:, None, :]).any(dim=2)
    best = (depths * valid).argmax(dim=1)
    on_path = ancestors.gather(1, best[:, None, None].expand(-1, 1, ancestors.shape[2]))[:, 0]
    levels = arange(trees.depth + 1, depths.device)
    at_depth = depths[:, None, :] == levels[None, :, None]
    # int32, not uint8: compiled on the CPU (inductor, torch 2.13), an argmax over a uint8 row made of booleans, all
    # false, returned garbage past 16 nodes.
    path = (at_depth & on_path[:, None, :]).to(torch.int32).argmax(dim=2)
    return path, depths.gather(1, best[:, None])[:, 0], best


def _uniform_rows(
    rows: int,
    n: int,
    generators: Sequence[torch.Generator | None] | None,
    sizes: Sequence[int] | None,
    device: torch.device,
) -> torch.Tensor:
    """(rows, n) draws from U[0, 1): from the global RNG at once, or row by row from each row's generator (its first
    `sizes[b]` only, the rest 0)."""
    if generators is None:
        return torch.rand(rows, n, device=device)
    u = torch.zeros(rows, n, device=device)
    for b, generator in enumerate(generators):
        count = n if sizes is None else sizes[b]
        source = device if generator is None else generator.device
        u[b, :count] = torch.rand(count, generator=generator, device=source).to(device)
    return u


def draw_rows(weights: torch.Tensor, generators: Sequence[torch.Generator | None] | None) -> torch.Tensor:
    """One token per row drawn in proportion to `weights` (B, V): from the global RNG at once, or each row from its
    generator."""
    if generators is None:
        return torch.multinomial(weights, 1)[:, 0]
    return torch.stack([draw(weights[b], generator) for b, generator in enumerate(generators)])


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token drawn in proportion to `weights` (V,), from `generator` (or the global RNG)."""
    source = weights if generator is None else weights.to(generator.device)
    return torch.multinomial(source, 1, generator=generator)[0].to(weights.device)
