"""Acceptance rules: which path of a verified tree is emitted, and the target's bonus token after it.

Both rules work on the whole tree at once (a few (n,) and (n, n) tensor operations), never on the vocabulary in
a Python loop, and leave their verdict on the device: nothing here waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass
class Verdict:
    """What a rule accepted, as device tensors of fixed shape.

    `path` (depth + 1,) holds the accepted node at each depth from the root on; entries past `accepted` are 0.
    `accepted` () is how many draft tokens were accepted, `bonus` () the target's token after them. `doubt` (), set
    by a sampler, says the distribution drawn from may differ from `generate`'s (see `NodeProcessing`).
    """

    path: torch.Tensor
    accepted: torch.Tensor
    bonus: torch.Tensor
    doubt: torch.Tensor | None = None


def accept_greedy(tree: DraftTree, target_choice: torch.Tensor) -> Verdict:
    """The deepest node whose whole path equals the target's choices, and the target's choice after it.

    Siblings carry distinct tokens, so at most one node per depth can agree with the target.
    """
    matches = tree.tokens == target_choice[tree.parents.clamp_min(0)]
    matches[0] = True
    path, accepted, best = deepest(tree, matches)
    return Verdict(path, accepted, _at(target_choice, best))


def accept_sampled(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """Recursive rejection over each node's children, in draft rank order: the accepted path and the bonus token.

    `probs` (n, V) is the target's processed distribution p after every node. At a node, child x_j is accepted with
    probability p'_j(x_j), where p'_j is p with the already rejected x_1..x_{j-1} removed and renormalised; an
    accepted child is descended into; when every child is rejected the bonus token is drawn from p' without them.
    Exactness: (1) x_j is accepted with prod_{i<j} (1 - p'_i(x_i)) p'_j(x_j) = p(x_j), the product telescoping
    since 1 - p'_i(x_i) = (1 - P_{i+1}) / (1 - P_i) with P_i = sum_{l<i} p(x_l); (2) all are rejected with
    probability 1 - P_{k+1}, and a token t outside the children is then drawn with p(t) / (1 - P_{k+1}), so with
    p(t) in all; (3) every token after the node thus follows p, and the chain rule over the path gives the target's
    distribution of the whole emitted sequence, whatever tree the draft proposed.

    One uniform u per node realises all of its trials at once: x_j is accepted when P_j <= u < P_j + p(x_j), which
    has the probabilities of (1); all children are rejected when u >= P_{k+1}. Children are deterministic (the
    draft's top ranks), so no draft probability enters the rule.
    """
    n = tree.size
    parents, children = tree.parents[1:], tree.tokens[1:]
    child_mass = probs[parents, children]
    earlier_sibling = (parents[:, None] == parents[None, :]).tril(-1)
    before = torch.where(earlier_sibling, child_mass[None, :], 0.0).sum(-1)
    rest = probs.index_put((parents, children), torch.zeros_like(child_mass))
    total = rest.sum(-1).index_add(0, parents, child_mass)
    u = _uniform(n, generator, probs.device) * total
    accepted = torch.ones(n, dtype=torch.bool, device=probs.device)
    accepted[1:] = (u[parents] >= before) & (u[parents] < before + child_mass)
    path, count, last = deepest(tree, accepted)
    bonus_weights = _at(rest, last)
    # Children covering the whole support leave no gap in exact arithmetic; a rounding one gets p itself.
    bonus_weights = torch.where(bonus_weights.sum() > 0, bonus_weights, _at(probs, last))
    return Verdict(path, count, draw(bonus_weights, generator))


def deepest(tree: DraftTree, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The deepest node all of whose path nodes are `accepted` (the first such, in node order): its path by depth
    `(tree.depth + 1,)` (0 past its depth), its depth and its index, all on the device."""
    valid = ~(tree.ancestors & ~accepted[None, :]).any(dim=1)
    best = (tree.depths * valid).argmax()
    on_path = _at(tree.ancestors, best)
    at_depth = tree.depths[None, :] == torch.arange(tree.depth + 1, device=tree.depths.device)[:, None]
    path = (at_depth & on_path[None, :]).to(torch.uint8).argmax(dim=1)
    return path, _at(tree.depths, best), best


def _at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`values[index]` for a 0-d index tensor, without the host read that indexing with it would make."""
    return values.index_select(0, index.view(1)).squeeze(0)


def _uniform(n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """n draws from U[0, 1) from `generator` (or the global RNG), on `device`."""
    source = device if generator is None else generator.device
    return torch.rand(n, generator=generator, device=source).to(device)


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token drawn in proportion to `weights` (V,), from `generator` (or the global RNG)."""
    source = weights if generator is None else weights.to(generator.device)
    return torch.multinomial(source, 1, generator=generator)[0].to(weights.device)
