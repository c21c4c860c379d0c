"""Verifier attention on visual tokens, measured while the target prefills, without full attention matrices.

The tree attention hands each layer's rotated queries and keys to an observer while the target prefills; for the
chosen layers it takes the rows of the prompt's trailing text (those after the last visual token) and computes
softmax(q k^T) for those rows only: (heads x text rows x prompt) per layer, grouped-query heads folded onto their
key head, so no key is copied. Scores are averaged over heads, text rows and layers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch

from ..adapters import ModelAdapter, VisualLayout
from ..attention import fold_heads, observing, tree_attention


class VerifierScores:
    """Context manager around a target prefill; `scores` (n_visual,) afterwards, `seconds` the time scoring took.

    In a batched prefill of left-padded prompts, a scorer measures its own `row`, whose prompt starts after `offset`
    padding positions (`scoring` runs the rows' scorers together)."""

    def __init__(
        self,
        adapter: ModelAdapter,
        layout: VisualLayout,
        layers: Sequence[int] | None = None,
        row: int = 0,
        offset: int = 0,
    ):
        self.adapter = adapter
        self.row, self.offset = row, offset
        self.visual = layout.positions + offset
        modules = adapter.attention_modules()
        self.modules = {id(m) for m in (modules if layers is None else [modules[i] for i in layers])}
        length = layout.mask.shape[0]
        last_visual = int(layout.positions[-1]) if layout.positions.numel() else length
        self.rows = torch.arange(last_visual + 1, length, device=layout.mask.device) + offset
        self.total = torch.zeros(self.visual.shape[0], device=layout.mask.device)
        self.layers_seen = 0
        self.seconds = 0.0
        self._stack = ExitStack()

    @property
    def measures(self) -> bool:
        """Whether the prompt has both visual tokens and text after them to measure with."""
        return bool(self.rows.numel() and self.visual.numel())

    def __enter__(self) -> VerifierScores:
        if self.measures:
            self._stack.enter_context(tree_attention(self.adapter.language_model.config))
            self._stack.enter_context(observing(self._observe))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    @property
    def scores(self) -> torch.Tensor:
        """Mean attention of the text rows on each visual token (all zeros when there was nothing to measure)."""
        return self.total / max(1, self.layers_seen)

    @torch.no_grad()
    def _observe(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor) -> None:
        if id(module) not in self.modules:
            return
        started = time.perf_counter()
        rows = self.rows.to(query.device)
        kv_heads, length, dim = key.shape[1], key.shape[2], key.shape[3]
        row = self.row
        q = fold_heads(query[row : row + 1, :, rows], kv_heads)
        logits = (q @ key[row : row + 1].transpose(-1, -2)).float() * getattr(module, "scaling", dim**-0.5)
        columns = torch.arange(length, device=key.device)[None, :]
        unseen = (columns > rows[:, None]) | (columns < self.offset)
        logits = logits.view(kv_heads, -1, rows.shape[0], length).masked_fill_(unseen, float("-inf"))
        probs = logits.softmax(dim=-1)
        self.total += probs[..., self.visual.to(probs.device)].mean(dim=(0, 1, 2)).to(self.total.device)
        self.layers_seen += 1
        self.seconds += time.perf_counter() - started


@contextmanager
def scoring(adapter: ModelAdapter, scorers: Sequence[VerifierScores]) -> Iterator[None]:
    """Run the scorers of a batched prefill's rows together, through one observer of its attention."""
    active = [s for s in scorers if s.measures]
    if not active:
        yield
        return

    def observe(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor) -> None:
        for scorer in active:
            scorer._observe(module, query, key)

    with tree_attention(adapter.language_model.config), observing(observe):
        yield
