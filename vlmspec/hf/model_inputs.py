"""The model inputs of a `generate` call, sorted as the contract sorts them (`contract.APPLIED_INPUTS`,
`NO_EFFECT_INPUTS`, `REFUSED_INPUTS`), and the prompt they make: the ids the output starts with, the ids the draft and
pruning read, the target's embeddings where the caller gives them, and the cache the call goes on from."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from ..adapters import ModelAdapter
from ..errors import UnsupportedGenerationError
from .contract import APPLIED_INPUTS, NO_EFFECT_INPUTS, REFUSED_INPUTS

#: Rows of the target's embedding table compared at once when finding the tokens of embeddings given alone.
_NEAREST_CHUNK = 256


@dataclass
class PromptInputs:
    """A call's prompt: `inputs` are the model inputs vlmspec applies (`input_ids` (B, L) always, the target's
    `inputs_embeds` (B, L, hidden) where given), `output_ids` (B, P) what the returned sequences start with (the
    ids, or none where embeddings came alone, as `generate` returns them), `cache` the cache the call goes on from."""

    inputs: dict[str, Any]
    output_ids: torch.Tensor
    cache: Cache | None = None

    @property
    def embeddings_alone(self) -> bool:
        """Whether the caller gave embeddings without ids (the ids here are the embeddings' nearest tokens)."""
        return self.output_ids.shape[1] == 0 and self.inputs["input_ids"].shape[1] > 0


def forward_inputs(target: PreTrainedModel) -> set[str]:
    """The inputs the target's `forward` takes by name (those `generate` passes it from its keyword arguments)."""
    parameters = inspect.signature(target.forward).parameters.values()
    return {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD} | {"past_key_values"}


def sort_inputs(
    target: PreTrainedModel, adapter: ModelAdapter, input_ids: torch.Tensor | None, kwargs: dict[str, Any]
) -> PromptInputs:
    """Take the model inputs out of `kwargs` (what is left are generation arguments): refuse those vlmspec refuses,
    naming them, drop those without effect, and make the prompt of the applied ones.

    An input of the target's `forward` that the contract has not sorted (one a new release adds) is refused by name.
    """
    names = forward_inputs(target) | set(adapter.input_keys)
    given = {name: kwargs.pop(name) for name in names & kwargs.keys()}
    given = {name: value for name, value in given.items() if value is not None}
    for name in sorted(given):
        if name in REFUSED_INPUTS:
            raise UnsupportedGenerationError(f"generate(): {name} is not supported: {REFUSED_INPUTS[name]}")
        if name not in APPLIED_INPUTS and name not in NO_EFFECT_INPUTS and name != "use_cache":
            raise UnsupportedGenerationError(
                f"generate(): {name} is a model input vlmspec has not been checked against; leave it unset"
            )
    if "use_cache" in given:
        kwargs["use_cache"] = given.pop("use_cache")
    cache = given.pop("cache", None)
    cache = given.pop("past_key_values", cache)
    applied = {k: v for k, v in given.items() if k in APPLIED_INPUTS}
    embeds = applied.pop("inputs_embeds", None)
    if input_ids is None:
        input_ids = applied.pop("input_ids", None)
    applied.pop("input_ids", None)
    if input_ids is None and embeds is None:
        raise ValueError("generate() needs input_ids or inputs_embeds (what the target's processor returned)")
    output_ids, ids = _prompt_ids(target, input_ids, embeds)
    check_left_padded(applied.get("attention_mask"), ids)
    inputs = {**applied, "input_ids": ids}
    if embeds is not None:
        inputs["inputs_embeds"] = embeds
    return PromptInputs(inputs, output_ids, cache)


def _prompt_ids(
    target: PreTrainedModel, input_ids: torch.Tensor | None, embeds: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the output starts with and the ids the prompt is read as: the caller's ids for both, or (embeddings
    alone) none and the embeddings' nearest tokens."""
    if input_ids is not None and input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    if embeds is None:
        return input_ids, input_ids
    hidden = target.get_input_embeddings().weight.shape[1]
    if embeds.ndim != 3 or embeds.shape[2] != hidden:
        raise ValueError(f"inputs_embeds must be (batch, length, {hidden}), got shape {tuple(embeds.shape)}")
    if input_ids is None:
        return embeds.new_zeros(embeds.shape[0], 0, dtype=torch.long), nearest_tokens(target, embeds)
    if input_ids.shape != embeds.shape[:2]:
        raise ValueError(
            f"inputs_embeds {tuple(embeds.shape)} and input_ids {tuple(input_ids.shape)} must cover the same tokens"
        )
    return input_ids, input_ids


def nearest_tokens(target: PreTrainedModel, embeds: torch.Tensor) -> torch.Tensor:
    """`(B, L)` the token whose row of the target's input embedding table is nearest each of `embeds` `(B, L,
    hidden)`: the very token where the caller embedded ids (placeholders for images and videos among them), which
    the draft and pruning then read. The target itself reads the embeddings; what the draft reads changes only how
    much of its proposal is accepted, never the output."""
    table = target.get_input_embeddings().weight
    flat = embeds.reshape(-1, embeds.shape[-1]).to(device=table.device, dtype=table.dtype)
    norms = torch.linalg.vector_norm(table, dim=1, dtype=torch.float32).pow(2)
    ids = [(2 * (chunk @ table.T).float() - norms).argmax(1) for chunk in flat.split(_NEAREST_CHUNK)]
    return torch.cat(ids).reshape(embeds.shape[:2]).to(embeds.device)


def check_left_padded(mask: torch.Tensor | None, input_ids: torch.Tensor) -> None:
    """Refuse a batch whose attention mask has zeros after a prompt's start (right padding): `generate` decodes it
    with a warning that the results are not correct; vlmspec decodes each row exactly as alone, which needs left
    padding."""
    if mask is None:
        return
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(mask.shape)} must be shaped as input_ids {tuple(input_ids.shape)}")
    started = mask.cumsum(1) > 0
    if bool((started & (mask == 0)).any()):
        raise UnsupportedGenerationError(
            "generate(): attention_mask is right-padded (zeros after a prompt's start), which generate decodes with a "
            "warning that its results are not correct: pad on the left (processor.tokenizer.padding_side = 'left')"
        )
