"""One training example as the pair meets it when decoding: the target reads the whole prompt (its attention over the
visual tokens chooses what the draft sees, as at decoding) and the response; the draft reads the prompt's kept tokens
and the response. What the draft is fitted to is the target's processed next-token distribution at each response
position."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..adapters import ModelAdapter
from ..attention import tree_attention
from ..processors import append_tokens
from ..pruning import PruningConfig, VerifierScores


@dataclass
class Example:
    """A prompt's processor outputs (`inputs`, batch size 1), its `response` ids (R,), which prompt tokens the draft
    sees (`keep` (P,) bool, None: all) and the target's distribution `(R, vocab_limit)` at each response position."""

    inputs: dict[str, Any]
    response: torch.Tensor
    keep: torch.Tensor | None
    target_probs: torch.Tensor

    @property
    def prompt_length(self) -> int:
        return self.inputs["input_ids"].shape[1]


def teacher_distribution(logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """The target's distribution `(N, V)` from its logits `(N, V)`, tempered as its generation config samples
    (temperature 1 for a greedy config: the draft learns the whole distribution, whose argmax is the target's
    choice)."""
    temperature = config.temperature if config.do_sample and config.temperature else 1.0
    return torch.softmax(logits.float() / temperature, dim=-1)


@torch.no_grad()
def make_example(
    target: PreTrainedModel,
    adapter: ModelAdapter,
    inputs: dict[str, Any],
    response: torch.Tensor,
    pruning: PruningConfig | None,
    vocab_limit: int,
) -> Example:
    """The target's forward over prompt and response, scoring the visual tokens with its attention on the way (the
    prompt's rows only, as the prefill at decoding scores them: causal attention keeps the response out of them)."""
    layout = adapter.visual_layout(inputs) if pruning is not None else None
    prune = layout is not None and bool(layout.mask.any())
    scorer = VerifierScores(adapter, layout, pruning.layers) if prune and pruning.method == "verifier" else None
    full = append_tokens(inputs, response)
    with tree_attention(adapter.language_model.config), scorer or nullcontext():
        out = target(
            **adapter.model_inputs(full),
            position_ids=adapter.prompt_positions(full),
            logits_to_keep=response.shape[0] + 1,
        )
    logits = out.logits[0, :-1, :vocab_limit]
    keep = None
    if prune:
        keep = pruning.keep_mask(layout, adapter.has_video(inputs), None if scorer is None else scorer.scores)
    return Example(inputs, response, keep, teacher_distribution(logits, target.generation_config))


def draft_log_probs(draft: PreTrainedModel, adapter: ModelAdapter, example: Example, vocab_limit: int) -> torch.Tensor:
    """The draft's log-probabilities `(R, vocab_limit)` at each response position, reading the prompt's kept tokens
    and the response (with gradient)."""
    full = append_tokens(example.inputs, example.response)
    keep = None
    if example.keep is not None:
        ones = torch.ones(example.response.shape[0], dtype=torch.bool, device=example.keep.device)
        keep = torch.cat([example.keep, ones])[None]
    with adapter.pruned(keep):
        out = draft(
            **adapter.model_inputs(full),
            position_ids=adapter.prompt_positions(full),
            logits_to_keep=example.response.shape[0] + 1,
        )
    logits = out.logits[0, :-1, :vocab_limit]
    return torch.log_softmax(logits.float(), dim=-1)
