"""One model with its KV cache: how long the cache is and where the next token sits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..adapters import ModelAdapter
from ..attention import tree_attention
from .cache import TREE_ROOM, SlabCache, check_cache, fixed_capacity
from .compiled import CHECK_TOKENS, CompileGuard, fixed_mask, padded_size, padded_sizes
from .tree import additive_mask


class ModelRunner:
    """Feeds tokens to a model through its adapter and keeps cache length and positions consistent.

    Tokens after the prompt are positioned one after another: the token at cache index i sits at position
    `i + offset`, where the offset comes from the prompt (M-RoPE prompts end beyond their length, pruned ones short).

    With `compiled` (the model under `torch.compile`), decoding forwards run fixed-shape through it: tokens padded
    to one of a few sizes, the cache fixed at a rounded capacity, the mask spanning it; the cache's buffers are kept
    from call to call (a call that needs more room grows them). Prompts always run eager. `guard` (the pair's) decides
    what a compiled forward that fails does: raise, or turn the pair eager and run the forward again eager.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        compiled: Callable | None = None,
        guard: CompileGuard | None = None,
        role: str = "model",
    ):
        self.adapter = adapter
        self.compiled = compiled
        self.role = role
        self.guard = guard if compiled is not None else None
        if self.guard is not None:
            self.guard.attach(self)
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
        capacity = prompt + room + TREE_ROOM
        if self.compiled is None:
            self.cache = SlabCache(self.adapter.layer_devices(), capacity)
        else:
            self.cache = SlabCache(self.adapter.layer_devices(), fixed_capacity(capacity), reuse=self.cache)
        with tree_attention(self.adapter.language_model.config):
            result = self.adapter.prefill(inputs, self.cache, keep)
        self.cache.settle()
        self.offset = result.next_position - result.length
        if self.compiled is not None:
            self.cache.fix()
        return result.last_logits.to(self.device)

    def prefill_rows(self, inputs: dict[str, Any], keep: torch.Tensor | None = None) -> tuple[torch.Tensor, list[int]]:
        """Run a left-padded batch of prompts (eager) into a cache of as many rows; returns each row's last-token
        logits `(B, V)` and the position of each row's next token. Row b's prompt sits in its cache row after its
        padding, up to the batch's length; with `keep` (B, L) bool, only its kept tokens, left-padded again to the
        most any row keeps."""
        self.refresh()
        self.cache = SlabCache(self.adapter.layer_devices(), inputs["input_ids"].shape[1])
        with tree_attention(self.adapter.language_model.config):
            logits, positions = self.adapter.prefill_rows(inputs, self.cache, keep)
        self.cache.settle()
        return logits.to(self.device), positions

    def position(self, index: int) -> int:
        """Position of the token at cache index `index` (an index at or after the prompt's end)."""
        return index + self.offset

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, bias: torch.Tensor, base_index: int) -> torch.Tensor:
        """Append `tokens` at positions `position(base_index) + depths`; `bias` (1, 1, q, k) is the additive mask
        over the last k keys (the tokens' own and those of earlier tree levels), every key before them is seen."""
        positions = depths + self.position(base_index)
        if self.cache.fixed:
            return self._fixed_forward(tokens, positions, bias, compiled=True)
        with tree_attention(self.adapter.language_model.config):
            logits = self.adapter.decode(tokens, positions, bias, self.cache)
        self.cache.settle()
        return logits.to(self.device)

    def warm_up(self, largest: int) -> None:
        """Run the compiled forward once at every padded size up to `largest` tokens over the cache (compiling each),
        leaving the cache as it was."""
        start = self.length
        for size in padded_sizes(largest):
            if self.compiled is None:
                return
            tokens = torch.zeros(size, dtype=torch.long, device=self.device)
            depths = torch.arange(1, size + 1, device=self.device)
            self.forward(tokens, depths, self.causal_bias(size), start)
            self.keep(start, tokens[:0])

    def check_compiled(self, logits: torch.Tensor) -> None:
        """Once per model under `compile="auto"`, right after a prompt (whose last `logits` are given): decode
        `CHECK_TOKENS` tokens greedily through the compiled forward and through the eager one, one token at a time and
        then the same tokens as one causal block, and report to the guard whether both chose the same tokens. The
        cache is left as the prompt left it. Run it outside any observer of the prompt's attention (pruning scores)."""
        if self.guard is not None:
            first = logits.reshape(-1)[None]
            self.guard.check(self, lambda compiled: self._greedy_check(first.argmax(-1), compiled), "forwards")

    def _greedy_check(self, first: torch.Tensor, compiled: bool) -> list[int]:
        """The tokens `check_compiled` compares, from one run of fixed-shape forwards, compiled or eager."""
        start, fed, chosen = self.length, [first], []
        for _ in range(CHECK_TOKENS):
            position = torch.full((1,), self.position(self.length), device=self.device)
            logits = self._fixed_forward(fed[-1], position, self.causal_bias(1), compiled)
            chosen.append(logits[-1:].argmax(-1))
            fed.append(chosen[-1])
        self.keep(start, first[:0])
        block = torch.cat(fed[:-1])
        positions = torch.arange(CHECK_TOKENS, device=self.device) + self.position(start)
        chosen.append(self._fixed_forward(block, positions, self.causal_bias(CHECK_TOKENS), compiled).argmax(-1))
        self.keep(start, first[:0])
        return torch.cat(chosen).tolist()

    def _fixed_forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor, compiled: bool
    ) -> torch.Tensor:
        """`forward` at the padded size over the whole fixed cache, through the compiled model (while the pair runs
        compiled, and `compiled` asks for it) or the model itself. A compiled forward that raises goes to the guard,
        which raises it or turns the pair eager; then the forward runs again eager (it wrote only past the cache's
        length, which the next forward overwrites)."""
        count, cache = tokens.shape[0], self.cache
        size = padded_size(count)
        cache.reserve(cache.length + size)
        if size > count:
            tokens = torch.cat([tokens, tokens.new_zeros(size - count)])
            positions = torch.cat([positions, positions[-1:].expand(size - count)])
        mask = fixed_mask(bias, cache.length + count, size, cache.capacity)
        module = self.compiled if compiled else None
        with tree_attention(self.adapter.language_model.config):
            try:
                logits = self.adapter.decode(tokens, positions, mask, cache, module)
            except Exception as error:
                if module is None or self.guard is None:
                    raise
                self.guard.fall_back(f"the {self.role}'s compiled {size}-token forward", error)
                logits = self.adapter.decode(tokens, positions, mask, cache)
        logits = logits[:count]
        cache.advance(count)
        # A CUDA graph's outputs live in its memory pool, which its next replay overwrites.
        return logits.clone() if logits.device.type == "cuda" else logits.to(self.device)

    def keep(self, start: int, keep: torch.Tensor) -> None:
        """Keep, of the entries from cache index `start` on, those at offsets `keep` (ascending)."""
        self.cache.keep(start, keep)

    def causal_bias(self, q: int) -> torch.Tensor:
        """Additive mask block for `q` new tokens appended causally after the current cache."""
        causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril_()
        return additive_mask(causal, self.dtype)
