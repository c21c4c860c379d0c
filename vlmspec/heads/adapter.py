"""A draft head as the engine's runners see a model: its prompt pass over the target's features of the prompt, its
positions the target's (3-D M-RoPE for Qwen), its visual layout the target's."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from ..adapters.base import FEATURE_KEY, ModelAdapter, Prefill, VisualLayout, kept_index
from ..engine.tree import additive_mask
from .module import Eagle3Head


class HeadAdapter(ModelAdapter):
    """`ModelAdapter` of an `Eagle3Head` drafting for the target `target` (its adapter): the head reads the target's
    inputs and positions; its prompt pass (`prefill_rows`) feeds every prompt token after the first beside the
    target's feature of the token before it (`FEATURE_KEY` among the inputs), each at that feature's position."""

    def __init__(self, head: Eagle3Head, target: ModelAdapter):
        super().__init__(head)
        self.target = target
        self.input_keys = (*target.input_keys, FEATURE_KEY)
        self.token_keys = target.token_keys
        self.position_only_keys = target.position_only_keys
        self.video_input_keys = target.video_input_keys

    @property
    def vocab_size(self) -> int:
        return self.model.head_config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.fc.weight.dtype

    @property
    def language_model(self) -> torch.nn.Module:
        return self.model

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        return self.target.prompt_positions(inputs)

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return self.target.position_ids(positions)

    def visual_layout(self, inputs: dict[str, Any]) -> VisualLayout:
        return self.target.visual_layout(inputs)

    def split_visual(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        return self.target.split_visual(inputs)

    def join_rows(self, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        return type(self.target).join_rows(rows, pad_token_id)

    def prefill(self, inputs: dict[str, Any], cache: Cache, keep: torch.Tensor | None = None) -> Prefill:
        logits, positions = self.prefill_rows(inputs, cache, None if keep is None else keep[None])
        length = inputs["input_ids"].shape[1] if keep is None else int(keep.sum())
        return Prefill(last_logits=logits[0], length=length - 1, next_position=positions[0])

    def prefill_rows(
        self, inputs: dict[str, Any], cache: Cache, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """Feed a left-padded batch's prompt entries: token t + 1 beside the target's feature at t, at t's position,
        for every kept t but the last token (whose feature goes beside the first new token), each row's entries
        left-padded again to the most any row holds. Returns each row's last entry's logits `(B, V)` and the
        position of each row's next entry (its last prompt token's)."""
        ids, features = inputs["input_ids"], inputs[FEATURE_KEY]
        positions = self.prompt_positions(inputs)
        mask = inputs.get("attention_mask")
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        entries = real[:, :-1] if keep is None else real[:, :-1] & keep[:, :-1].to(real.device)
        index, kept = kept_index(entries)
        tokens = ids[:, 1:].gather(1, index)
        fed = features[:, :-1].gather(1, index[..., None].expand(-1, -1, features.shape[-1]))
        placed = positions[..., :-1].gather(-1, index.expand(*positions.shape[:-2], -1, -1))
        nexts = [int(positions[..., b, -1].max()) for b in range(ids.shape[0])]
        if tokens.shape[1] == 0:
            return torch.zeros(ids.shape[0], self.vocab_size, device=self.device), nexts
        width = tokens.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        seen = (causal[None] & kept[:, None, :]) | torch.eye(width, dtype=torch.bool, device=ids.device)[None]
        additive = torch.zeros(seen.shape, dtype=self.dtype, device=self.device)
        additive = additive.masked_fill(~seen.to(self.device), torch.finfo(self.dtype).min)[:, None]
        out = self.model(
            input_ids=tokens.to(self.device),
            position_ids=placed.to(self.device),
            features=fed.to(self.device),
            attention_mask=additive,
            cache=cache,
            logits_to_keep=1,
        )
        return out.logits[:, -1], nexts

    def continue_entries(self, tokens: torch.Tensor, features: torch.Tensor, cache: Cache, next_position: int) -> None:
        """Feed `tokens` (1, q) beside `features` (1, q, 3H) at positions from `next_position` on, after every entry
        `cache` holds: a head going on from a returned cache, whose target ran only the tokens after it."""
        q = tokens.shape[1]
        if q == 0:
            return
        causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        additive = additive_mask(causal, self.dtype, prefix_len=cache.get_seq_length())
        positions = torch.arange(next_position, next_position + q, device=self.device)
        self.model(
            input_ids=tokens.to(self.device),
            position_ids=self.position_ids(positions),
            features=features.to(self.device),
            attention_mask=additive,
            cache=cache,
            logits_to_keep=1,
        )
