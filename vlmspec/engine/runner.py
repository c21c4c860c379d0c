"""One model with its KV cache: how long the cache is and where the next token sits."""

from __future__ import annotations

from typing import Any

import torch

from ..adapters import ModelAdapter
from .cache import TREE_ROOM, SlabCache, check_cache
from .tree import additive_mask


class ModelRunner:
    """Feeds tokens to a model through its adapter and keeps cache length and positions consistent.

    Tokens after the prompt are positioned one after another: the token at cache index i sits at position
    `i + offset`, where the offset comes from the prompt (M-RoPE prompts end beyond their length, pruned ones short).
    """

    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter
        self.cache: SlabCache | None = None
        self.offset = 0
        check_cache(adapter.model.config)
        self.refresh()

    @property
    def length(self) -> int:
        """Positions in the cache."""
        return 0 if self.cache is None else self.cache.length

    def refresh(self) -> None:
        """Read the model's device and dtype (once per call: looking them up costs more than a tree operation)."""
        self.device = self.adapter.device
        self.dtype = self.adapter.dtype

    def prefill(self, inputs: dict[str, Any], keep: torch.Tensor | None = None, room: int = 0) -> torch.Tensor:
        """Run the prompt (only the `keep` tokens, if given) into a cache preallocated for it and `room` more
        tokens (plus a tree's); returns the last prompt token's logits."""
        self.refresh()
        prompt = inputs["input_ids"].shape[1] if keep is None else int(keep.sum())
        self.cache = SlabCache(self.adapter.layer_devices(), prompt + room + TREE_ROOM)
        result = self.adapter.prefill(inputs, self.cache, keep)
        self.cache.settle()
        self.offset = result.next_position - result.length
        return result.last_logits.to(self.device)

    def position(self, index: int) -> int:
        """Position of the token at cache index `index` (an index at or after the prompt's end)."""
        return index + self.offset

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, bias: torch.Tensor, base_index: int) -> torch.Tensor:
        """Append `tokens` at positions `position(base_index) + depths` through the additive mask `bias`."""
        positions = depths + self.position(base_index)
        logits = self.adapter.decode(tokens, positions, bias, self.cache)
        self.cache.settle()
        return logits.to(self.device)

    def keep(self, start: int, keep: torch.Tensor) -> None:
        """Keep, of the entries from cache index `start` on, those at offsets `keep` (ascending)."""
        self.cache.keep(start, keep)

    def causal_bias(self, q: int) -> torch.Tensor:
        """Additive mask for `q` new tokens appended causally after the current cache."""
        causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril_()
        return additive_mask(self.length, causal, self.dtype)
