"""Verifier attention on visual tokens, measured while the target prefills, without full attention matrices.

A hook after each chosen attention layer has the adapter rebuild the queries of the prompt's trailing text rows
(those after the last visual token) from the layer's input, takes the rotated keys the layer just wrote to the
cache, and computes softmax(q k^T) for those rows only: (heads x text rows x prompt) per layer, whatever attention
kernel the model runs. Scores are averaged over heads, text rows and layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..adapters import ModelAdapter, VisualLayout


class VerifierScores:
    """Context manager around a target prefill; `scores` (n_visual,) afterwards, `seconds` the time the hooks took."""

    def __init__(self, adapter: ModelAdapter, layout: VisualLayout, layers: Sequence[int] | None = None):
        self.adapter = adapter
        self.visual = layout.positions
        modules = adapter.attention_modules()
        self.modules = modules if layers is None else [modules[i] for i in layers]
        length = layout.mask.shape[0]
        last_visual = int(self.visual[-1]) if self.visual.numel() else length
        self.rows = torch.arange(last_visual + 1, length, device=layout.mask.device)
        self.total = torch.zeros(self.visual.shape[0], device=layout.mask.device)
        self.layers_seen = 0
        self.seconds = 0.0
        self._handles: list = []

    def __enter__(self) -> VerifierScores:
        if self.rows.numel() and self.visual.numel():
            self._handles = [m.register_forward_hook(self._hook, with_kwargs=True) for m in self.modules]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def scores(self) -> torch.Tensor:
        """Mean attention of the text rows on each visual token (all zeros when there was nothing to measure)."""
        return self.total / max(1, self.layers_seen)

    @torch.no_grad()
    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict, output) -> None:
        started = time.perf_counter()
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        keys = kwargs["past_key_values"].layers[module.layer_idx].keys
        rows = self.rows.to(hidden.device)
        q = self.adapter.text_queries(module, hidden, kwargs["position_embeddings"], rows)
        keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
        logits = (q @ keys.transpose(-1, -2)).float() * module.scaling
        future = torch.arange(keys.shape[2], device=keys.device)[None, :] > rows[:, None]
        probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
        self.total += probs[0][:, :, self.visual.to(probs.device)].mean(dim=(0, 1)).to(self.total.device)
        self.layers_seen += 1
        self.seconds += time.perf_counter() - started
