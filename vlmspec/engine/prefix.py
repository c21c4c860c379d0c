"""What a model already holds of a sequence, carried between calls: a conversation's next turn continues from the
keys and values its last turn left, as `generate` continues from a cache, instead of reading the whole conversation
again."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CachedPrefix:
    """One model's keys and values for a sequence's first `covers` tokens: `layers` holds per decoder layer its keys
    and values `(1, kv heads, n, head dim)` (n = `covers` for the target; fewer for a draft whose prompt pruning cut),
    and the token at index `covers` of the sequence goes at position `next_position`."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    covers: int
    next_position: int

    @property
    def length(self) -> int:
        """The entries each layer holds."""
        return self.layers[0][0].shape[2]


@dataclass
class Continuation:
    """What a sequence's models hold when it goes on: the target's prefix, and the draft's where it is known (a cache
    vlmspec returned); without it the draft reads the sequence again."""

    target: CachedPrefix
    draft: CachedPrefix | None = None
