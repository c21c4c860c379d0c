"""Relaxed (lossy) verification: confidence-modulated acceptance of draft tokens the target would not have chosen.

The seed on confidence-modulated speculative decoding (CM-ASD, section III.B(c), "Confidence-modulated verification",
and its Algorithm 1, lines 14-17) accepts a drafted token y at position t when both hold:

- (i) top-beta inclusion: `log P(y) >= log P(y^(beta))`, y^(beta) the target's beta-th most likely token;
- (ii) gap-bounded acceptance: `log P(y^(1)) - log P(y) <= tau_t`,

with the adaptive margin `tau_t = tau_base + gamma (1 - C_t)`, C_t in [0, 1] the drafter's mixed confidence at t
(entropy, logit margin and softmax margin, `mixed_confidence`, the confidence policy's measure). The seed numbers none
of these equations. Its prose says the opposite of its formula: "the less confident the drafter is at time t, the
stricter the verification criterion becomes" and "if the drafter is confident, verify more leniently". The formula
is the default (`direction="formula"`); `direction="prose"` takes `tau_t = tau_base + gamma C_t`, a margin that
widens with confidence, as the prose reads.

A token accepted this way may differ from the target's own choice: the output is then no longer the target's. This
is never a default; every call that takes it is labelled and counts the tokens that differ (`SpecStats`). Only
greedy decoding has it: for a sampled target, "the target's own output" is a distribution, and no margin over
log-probabilities defines a distribution to draw from, so a sampled config is refused by name.

Both sides of the gap come from the target's processed scores at the parent: a log-softmax subtracts one constant
from every entry, so `log P(a) - log P(b) = s_a - s_b` and no softmax is taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..device_tensors import arange, host_values
from ..errors import InvalidArgumentError
from ..policies import ConfidenceConfig, NodeMeasure
from ..policies.confidence import ConfidenceMix
from .accept import Verdict, deepest_rows
from .tree import Trees

DIRECTIONS = ("formula", "prose")
#: The largest `top_beta`: the rule takes the target's top-beta scores at every node, so a beta near the vocabulary
#: would sort it at every node of every step.
MAX_TOP_BETA = 64
VERIFICATION_NAMES = ("exact", "relaxed")


@dataclass(frozen=True)
class RelaxedVerification:
    """Lossy, confidence-modulated verification (CM-ASD): a drafted token is accepted when it is among the target's
    `top_beta` most likely and its log-probability is within `tau_t` of the target's top token, where
    `tau_t = tau_base + gamma (1 - C_t)` (`direction="formula"`, the seed's formula) or `tau_base + gamma C_t`
    (`direction="prose"`, as its prose reads), C_t the draft's mixed confidence where it proposed the token.

    Outputs then differ from the target's own; `SpecStats.differing_tokens` counts the emitted tokens that do.
    `tau_base` and `gamma` are in nats (natural log-probability), non-negative; `top_beta` from 1 to 64. With
    `tau_base=0`, `gamma=0` and `top_beta=1` only the target's own choices are accepted (ties aside).
    """

    tau_base: float = 0.1
    gamma: float = 1.0
    top_beta: int = 3
    direction: str = "formula"

    def __post_init__(self):
        if not (math.isfinite(self.tau_base) and self.tau_base >= 0):
            raise ValueError(f"tau_base must be a finite number >= 0, got {self.tau_base!r}")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"gamma must be a finite number >= 0, got {self.gamma!r}")
        whole = isinstance(self.top_beta, int) and not isinstance(self.top_beta, bool)
        if not whole or not 1 <= self.top_beta <= MAX_TOP_BETA:
            raise ValueError(f"top_beta must be an integer from 1 to {MAX_TOP_BETA}, got {self.top_beta!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}")

    @property
    def label(self) -> str:
        """A short description, for records and tables."""
        return f"relaxed(tau_base={self.tau_base:g}, gamma={self.gamma:g}, top_beta={self.top_beta}, {self.direction})"


VerificationChoice = str | RelaxedVerification | None


def resolve_verification(choice: VerificationChoice) -> RelaxedVerification | None:
    """`"exact"` or None (the target's own output: None) or `"relaxed"` (the defaults) or a `RelaxedVerification`."""
    if choice is None or choice == "exact":
        return None
    if choice == "relaxed":
        return RelaxedVerification()
    if isinstance(choice, RelaxedVerification):
        return choice
    raise ValueError(f"verification must be 'exact', 'relaxed' or a RelaxedVerification, got {choice!r}")


def refuse_sampling(verification: RelaxedVerification | None, do_sample: bool) -> None:
    """Raise where relaxed verification meets a sampled config (see the module's docstring)."""
    if verification is not None and do_sample:
        raise InvalidArgumentError(
            "verification='relaxed' is defined for greedy decoding only, and this generation config samples "
            "(do_sample=True): use verification='exact' or do_sample=False"
        )


#: What the growth measures of each expanded node for relaxed verification: the confidence policy's mixed
#: confidence, at its default weights and sharpness (one kept object, so compiled levels see one measure).
CONFIDENCE_MEASURE = NodeMeasure(1, ConfidenceMix(ConfidenceConfig().weights, ConfidenceConfig().sharpness))


@dataclass
class RelaxedRows:
    """Every row's relaxed rule as (B,) tensors, from one copy: `relaxed` (bool; False: exact), `tau_base`, `gamma`,
    `beta` (long), `prose` (bool, the prose's direction); `widest` the largest beta (host)."""

    relaxed: torch.Tensor
    tau_base: torch.Tensor
    gamma: torch.Tensor
    beta: torch.Tensor
    prose: torch.Tensor
    widest: int

    @staticmethod
    def of(rules: Sequence[RelaxedVerification | None], device: torch.device) -> RelaxedRows | None:
        """The rows' rules (None for an exact row) on `device`; None where every row is exact."""
        if all(rule is None for rule in rules):
            return None
        exact = RelaxedVerification(0.0, 0.0, 1)
        own = [exact if rule is None else rule for rule in rules]
        values = [float(rule is not None) for rule in rules]
        values += [r.tau_base for r in own] + [r.gamma for r in own] + [float(r.top_beta) for r in own]
        values += [float(r.direction == "prose") for r in own]
        held = host_values(values, device, torch.float32).view(5, len(rules))
        widest = max(r.top_beta for r in own)
        return RelaxedRows(held[0] > 0, held[1], held[2], held[3].long(), held[4] > 0, widest)


def margins(confidence: torch.Tensor, rules: RelaxedRows) -> torch.Tensor:
    """tau_t (B, N) at every node's distribution from the draft's confidence C_t there (B, N): `tau_base +
    gamma (1 - C_t)`, or `tau_base + gamma C_t` in a row of the prose's direction."""
    modulation = torch.where(rules.prose[:, None], confidence, 1.0 - confidence)
    return rules.tau_base[:, None] + rules.gamma[:, None] * modulation


def accept_relaxed_rows(trees: Trees, scores: torch.Tensor, rules: RelaxedRows) -> Verdict:
    """Every row's verdict under its rule from the target's processed `scores` (B, N, V) after each node, the draft's
    confidence at each node (`trees.confidence`, (B, N)).

    A node is accepted when its token is the target's choice after its parent, or, in a relaxed row, when it passes
    (i) and (ii) with its parent's margin; the deepest node whose whole path is accepted is taken (the first in node
    order, the draft's higher rank, among equally deep ones), and the bonus token is the target's choice after it. An
    exact row takes exactly `accept_greedy_rows`' verdict. `differs` (B, depth + 1) marks the emitted draft tokens
    that are not the target's choice (the bonus never is). A pure function of tensors: no read.
    """
    choice = scores.argmax(-1)
    if trees.size == 1:
        nothing = torch.zeros_like(choice[:, 0])
        return Verdict(nothing[:, None], nothing, choice[:, 0])
    parents = trees.row_parents().clamp_min(0)
    own = choice.gather(1, parents)
    exact = trees.tokens == own
    count, n, vocab = scores.shape
    token_score = scores.reshape(count, n * vocab).gather(1, parents * vocab + trees.tokens)
    widest = min(rules.widest, vocab)
    tops = scores.topk(widest, dim=-1).values
    beta_th = tops.gather(2, (rules.beta.clamp_max(widest) - 1)[:, None, None].expand(-1, n, 1))[:, :, 0]
    gap = tops[:, :, 0].gather(1, parents) - token_score
    within = (token_score >= beta_th.gather(1, parents)) & (gap <= margins(trees.confidence, rules).gather(1, parents))
    matches = exact | (rules.relaxed[:, None] & within)
    matches[:, 0] = True
    if trees.valid is not None:
        matches &= trees.valid
    path, accepted, best = deepest_rows(trees, matches)
    on_path = (trees.tokens != own).gather(1, path[:, 1:])
    differs = on_path & (arange(path.shape[1] - 1, path.device)[None] < accepted[:, None])
    differs = torch.cat([differs, torch.zeros_like(differs[:, :1])], dim=1)
    return Verdict(path, accepted, choice.gather(1, best[:, None])[:, 0], differs=differs)
