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
    by a sampler, says the distribution drawn from may differ from `generate`'s (see `NodeProcessing`). `differs`
    (depth + 1,), set by relaxed verification alone, marks the emitted tokens that are not the target's own choice.
    """

    path: torch.Tensor
    accepted: torch.Tensor
    bonus: torch.Tensor
    doubt: torch.Tensor | None = None
    differs: torch.Tensor | None = None

    def as_rows(self) -> Verdict:
        """One tree's verdict as a batch of one (views)."""
        return Verdict(*(None if t is None else t[None] for t in self._fields()))

    def row(self, b: int) -> Verdict:
        """Row `b`'s verdict of a batch's (views)."""
        return Verdict(*(None if t is None else t[b] for t in self._fields()))

    def _fields(self) -> tuple[torch.Tensor | None, ...]:
        return self.path, self.accepted, self.bonus, self.doubt, self.differs


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


@dataclass
class SamplingNoise:
    """The random numbers a sampled step's acceptance consumes, drawn before it (outside any compiled region) in the
    order and amounts the eager rule draws them: one uniform per node, `uniforms` (B, N) (a row with its own generator
    draws only its valid nodes', the rest 0), then one Exp(1) draw per vocabulary entry, `exponentials` (B, V), for the
    bonus token. `torch.multinomial` draws one sample as argmax(p / q) over such q (its fast path), so the bonus token
    `draw_with` takes is the very token `torch.multinomial` draws from the same random state, and the state moves on
    alike."""

    uniforms: torch.Tensor
    exponentials: torch.Tensor


def sampling_noise(
    rows: int,
    n: int,
    vocab: int,
    generators: Sequence[torch.Generator | None] | None = None,
    sizes: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> SamplingNoise:
    """The noise `rows` trees of `n` nodes over a vocabulary of `vocab` consume (`SamplingNoise`): from the global RNG
    at once, or row by row from each row's generator (a row's uniforms for its first `sizes[b]` nodes only)."""
    uniforms = _uniform_rows(rows, n, generators, sizes, device)
    if generators is None:
        return SamplingNoise(uniforms, torch.empty(rows, vocab, device=device).exponential_(1))
    exponentials = torch.stack([exponentials_from(vocab, generator, device) for generator in generators])
    return SamplingNoise(uniforms, exponentials)


def exponentials_from(vocab: int, generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """(vocab,) Exp(1) draws from `generator` (or the global RNG), made where the generator draws and moved to
    `device`."""
    source = device if generator is None else generator.device
    return torch.empty(vocab, device=source).exponential_(1, generator=generator).to(device)


def draw_with(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """The token (...,) drawn in proportion to `weights` (..., V) by `exponentials` (..., V) (`SamplingNoise`)."""
    return (weights / exponentials).argmax(-1)


def accept_sampled_rows(
    trees: Trees,
    probs: torch.Tensor,
    generators: Sequence[torch.Generator | None] | None = None,
    sizes: Sequence[int] | None = None,
) -> Verdict:
    """`sampled_verdict` with its noise drawn here: from the global RNG, or row b's from `generators[b]` (its first
    `sizes[b]` nodes' uniforms, its valid ones), as its tree alone would draw them."""
    rows, n, vocab = probs.shape
    return sampled_verdict(trees, probs, sampling_noise(rows, n, vocab, generators, sizes, probs.device))


def sampled_verdict(trees: Trees, probs: torch.Tensor, noise: SamplingNoise) -> Verdict:
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

    One uniform u per node (`noise.uniforms`) realises all of its trials at once: x_j is accepted when
    P_j <= u < P_j + p(x_j), which has the probabilities of (1); all children are rejected when u >= P_{k+1}.
    Children are deterministic (the draft's top ranks), so no draft probability enters the rule. The bonus token is
    drawn with `noise.exponentials` (`draw_with`). Invalid nodes (`trees.valid`) are not children at all: their mass
    stays with the bonus draw. A pure function of its tensors: nothing is drawn or read here.
    """
    rows, n, vocab = probs.shape
    if n == 1:  # the root alone (a plain step): the bonus token is drawn from p itself
        nothing = zeros(rows, probs.device)
        return Verdict(nothing[:, None], nothing, draw_with(probs[:, 0], noise.exponentials))
    parents, children = trees.row_parents()[:, 1:], trees.tokens[:, 1:]
    flat = probs.reshape(rows, n * vocab)
    index = parents * vocab + children
    full_mass = flat.gather(1, index)
    child_mass = full_mass if trees.valid is None else full_mass * trees.valid[:, 1:]
    earlier_sibling = (parents[:, :, None] == parents[:, None, :]).tril(-1)
    before = torch.where(earlier_sibling, child_mass[:, None, :], 0.0).sum(-1)
    rest = flat.scatter(1, index, full_mass - child_mass).view(rows, n, vocab)
    total = rest.sum(-1).scatter_add(1, parents, child_mass)
    u = (noise.uniforms * total).gather(1, parents)
    trials = (u >= before) & (u < before + child_mass)
    accepted = torch.cat([torch.ones(rows, 1, dtype=torch.bool, device=probs.device), trials], dim=1)
    path, count, last = deepest_rows(trees, accepted)
    at_last = last[:, None, None].expand(rows, 1, vocab)
    bonus_weights = rest.gather(1, at_last)[:, 0]
    # Children covering the whole support leave no gap in exact arithmetic; a rounding one gets p itself.
    bonus_weights = torch.where(bonus_weights.sum(-1, keepdim=True) > 0, bonus_weights, probs.gather(1, at_last)[:, 0])
    return Verdict(path, count, draw_with(bonus_weights, noise.exponentials))


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


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token drawn in proportion to `weights` (V,), from `generator` (or the global RNG): what
    `torch.multinomial(weights, 1, generator=generator)` draws, without its host reads."""
    return draw_with(weights, exponentials_from(weights.shape[0], generator, weights.device))
