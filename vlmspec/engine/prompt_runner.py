"""One model's prompt pass: its prompt (or a left-padded batch of prompts) run into a cache of its own, from which the
batch's rows are taken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..adapters import ModelAdapter
from ..attention import tree_attention
from .compiled import CompileGuard, GuardedRunner
from .prompt_cache import SlabCache, check_cache


class ModelRunner(GuardedRunner):
    """Runs prompts through a model's adapter into a `SlabCache` and says where generation goes on: the token after
    the prompt sits at cache index `length`, position `length + offset` (M-RoPE prompts end beyond their length,
    pruned ones short).

    It also holds the pair's compiled form of the model (`compiled`, None when it runs eager) under the pair's
    `guard`: the batch's runners take it from here at every call, so a fallback turns later calls eager too.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        compiled: Callable | None = None,
        guard: CompileGuard | None = None,
        role: str = "model",
    ):
        super().__init__(adapter, compiled, guard, role)
        self.cache: SlabCache | None = None
        self.offset = 0
        check_cache(adapter.model.config)
        self.refresh()

    @property
    def length(self) -> int:
        """Positions in the cache."""
        return 0 if self.cache is None else self.cache.length

    def prefill(self, inputs: dict[str, Any], keep: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompt (only the `keep` tokens, if given) into a cache of its size; returns the last prompt token's
        logits."""
        self.refresh()
        prompt = inputs["input_ids"].shape[1] if keep is None else int(keep.sum())
        self.cache = SlabCache(self.adapter.layer_devices(), prompt)
        with tree_attention(self.adapter.language_model.config):
            result = self.adapter.prefill(inputs, self.cache, keep)
        self.cache.settle()
        self.offset = result.next_position - result.length
        return result.last_logits.to(self.device)

    def prefill_rows(self, inputs: dict[str, Any], keep: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        """Run a left-padded batch of prompts into a cache of as many rows; returns each row's last-token logits
        `(B, V)` and the position of each row's next token. Row b's prompt sits in its cache row after its padding, up
        to the batch's length; with `keep` (B, L) bool, only its kept tokens, left-padded again to the most any row
        keeps."""
        self.refresh()
        self.cache = SlabCache(self.adapter.layer_devices(), inputs["input_ids"].shape[1])
        with tree_attention(self.adapter.language_model.config):
            logits, positions = self.adapter.prefill_rows(inputs, self.cache, keep)
        self.cache.settle()
        return logits.to(self.device), positions
