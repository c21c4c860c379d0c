"""The target's features for a draft head, taken inside the target's own forwards: forward pre-hooks on the decoder
layers the head reads keep a reference to the hidden state entering each (no copy, no second pass, no read), and the
runner hands them out after the forward, concatenated low to high as the head's `fc` takes them.

The hooks stay on the target for as long as it lives (one set per target and layers), so that a compiled forward's
graph, traced with them, is never traced again; under `torch.compile` dynamo replays their writes after the graph.
"""

from __future__ import annotations

import torch

#: Per target (in its `__dict__`): the taps installed on it, by the layers they read.
_ATTRIBUTE = "_vlmspec_feature_taps"


class FeatureTap:
    """Keeps the hidden states entering `layers` of a language model (`layers[i]` the state entering decoder layer
    i, transformers' `hidden_states[i]`; i = L, the last layer's output, is the state entering the final norm)
    during each forward."""

    def __init__(self, language_model: torch.nn.Module, layers: list[int]):
        self.layers = list(layers)
        self._seen: dict[int, torch.Tensor] = {}
        decoder = language_model.layers
        for index in sorted(set(layers)):
            module = decoder[index] if index < len(decoder) else language_model.norm
            module.register_forward_pre_hook(self._hook(index), with_kwargs=True)

    @staticmethod
    def on(language_model: torch.nn.Module, layers: list[int]) -> FeatureTap:
        """The tap of `language_model` reading `layers`, installed once."""
        taps = language_model.__dict__.setdefault(_ATTRIBUTE, {})
        key = tuple(layers)
        if key not in taps:
            taps[key] = FeatureTap(language_model, layers)
        return taps[key]

    def _hook(self, index: int):
        def keep(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            self._seen[index] = args[0] if args else kwargs["hidden_states"]

        return keep

    def take(self, rows: int | None = None, q: int | None = None) -> torch.Tensor:
        """The last forward's features `(B, L, 3H)`: the kept states concatenated low to high, of its first `rows`
        rows and `q` tokens where the forward ran padded (a fixed-shape one)."""
        features = torch.cat([self._seen[index] for index in self.layers], dim=-1)
        if rows is not None:
            features = features[:rows, :q]
        # A CUDA graph's outputs live in its memory pool, which its next replay overwrites.
        return features.clone() if features.device.type == "cuda" and rows is not None else features
