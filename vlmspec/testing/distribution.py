"""The exact distribution of a model's sampled continuations, and a G test of samples against it.

`exact_continuations` enumerates, with the target alone, every continuation of a few tokens and its probability
under `generate(do_sample=True)`'s own processors and warpers (read back from `output_scores`). Prefixes less
likely than `min_mass` are not expanded: each stands for all continuations that start with it, which coarsens the
partition the test compares on (needed where the support is wide, as with temperature alone, or the continuations
long) and keeps it exact. `g_test` compares sampled counts with those probabilities.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..processors import append_tokens

Continuation = tuple[int, ...]


def exact_continuations(
    model: PreTrainedModel, inputs: dict[str, Any], new_tokens: int, min_mass: float = 0.0, **generate_kwargs: Any
) -> dict[Continuation, float]:
    """Every continuation of up to `new_tokens` tokens (shorter where it ends with EOS, or where a prefix is less
    likely than `min_mass`) and its probability."""
    eos = set(eos_ids(model, generate_kwargs))
    result: dict[Continuation, float] = {}
    frontier: list[tuple[Continuation, float]] = [((), 1.0)]
    while frontier:
        prefix, mass = frontier.pop()
        if len(prefix) == new_tokens or (prefix and (prefix[-1] in eos or mass < min_mass)):
            result[prefix] = mass
            continue
        for token, p in next_token_distribution(model, inputs, prefix, **generate_kwargs).items():
            frontier.append((prefix + (token,), mass * p))
    return result


def next_token_distribution(
    model: PreTrainedModel, inputs: dict[str, Any], prefix: Continuation, **generate_kwargs: Any
) -> dict[int, float]:
    """The distribution `generate(do_sample=True)` draws the token after `prefix` from: its support and masses.

    The prefix joins the prompt, so processors that count new tokens (`min_new_tokens`, a repetition penalty's
    `prompt_ignore_length`) would see it differently than generation does: use row-wise warpers here.
    """
    extended = extend_inputs(inputs, prefix)
    out = model.generate(
        **extended,
        do_sample=True,
        max_new_tokens=1,
        output_scores=True,
        return_dict_in_generate=True,
        **generate_kwargs,
    )
    probs = out.scores[0][0].double().softmax(-1)
    support = (probs > 0).nonzero().squeeze(1)
    return {int(t): float(probs[t]) for t in support}


def extend_inputs(inputs: dict[str, Any], prefix: Continuation) -> dict[str, Any]:
    """Processor outputs with `prefix` appended as text tokens (ids, attention mask, token types)."""
    if not prefix:
        return dict(inputs)
    return append_tokens(inputs, torch.tensor(prefix))


@dataclass
class GTest:
    """A G test of observed counts against exact probabilities; `impossible` counts draws of probability zero."""

    statistic: float
    dof: int
    p_value: float
    samples: int
    impossible: int

    def passes(self, alpha: float) -> bool:
        return self.impossible == 0 and self.p_value >= alpha


def g_test(samples: Iterable[Continuation], exact: dict[Continuation, float], min_expected: float = 5.0) -> GTest:
    """G = 2 sum O ln(O / E) over the continuations, those expected fewer than `min_expected` times pooled.

    A sample counts for the shortest of its prefixes that is a continuation of `exact` (see `min_mass`).
    """
    counts = Counter(_cell(sample, exact) for sample in samples)
    n = sum(counts.values())
    impossible = sum(c for s, c in counts.items() if s not in exact)
    cells: list[tuple[float, float]] = []
    pooled_observed, pooled_expected = 0.0, 0.0
    for continuation, p in exact.items():
        observed, expected = float(counts.get(continuation, 0)), n * p
        if expected < min_expected:
            pooled_observed += observed
            pooled_expected += expected
        else:
            cells.append((observed, expected))
    if pooled_expected >= min_expected or (pooled_expected > 0 and not cells):
        cells.append((pooled_observed, pooled_expected))
    elif pooled_expected > 0:
        smallest = min(range(len(cells)), key=lambda i: cells[i][1])
        cells[smallest] = (cells[smallest][0] + pooled_observed, cells[smallest][1] + pooled_expected)
    if len(cells) < 2:
        raise ValueError(f"{len(cells)} cell(s) after pooling: the G test needs at least two; draw more samples")
    observed = torch.tensor([o for o, _ in cells], dtype=torch.float64)
    expected = torch.tensor([e for _, e in cells], dtype=torch.float64)
    terms = torch.where(observed > 0, observed * (observed / expected).log(), torch.zeros_like(observed))
    statistic = float(2 * terms.sum())
    dof = len(cells) - 1
    half = torch.tensor([dof / 2, statistic / 2], dtype=torch.float64)
    p_value = float(torch.special.gammaincc(half[0], half[1]))
    return GTest(statistic, dof, p_value, n, impossible)


def _cell(sample: Continuation, exact: dict[Continuation, float]) -> Continuation:
    """The continuation of `exact` that `sample` belongs to: its shortest prefix there (itself when none is)."""
    for length in range(1, len(sample) + 1):
        if sample[:length] in exact:
            return sample[:length]
    return sample


def eos_ids(model: PreTrainedModel, generate_kwargs: dict[str, Any]) -> list[int]:
    """The EOS ids `generate` stops at: the call's `eos_token_id`, else the model's generation config's."""
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def continuations(sequences: torch.Tensor, prompt_length: int, eos_token_ids: Iterable[int]) -> list[Continuation]:
    """The new tokens of each row of `sequences` (n, L), cut after the first EOS (dropping the padding)."""
    eos = set(eos_token_ids)
    result = []
    for row in sequences[:, prompt_length:].tolist():
        ends = [i for i, token in enumerate(row) if token in eos]
        result.append(tuple(row[: ends[0] + 1] if ends else row))
    return result
