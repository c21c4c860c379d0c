"""The cache `generate` returns and goes on from, for vlmspec: the target's keys and values laid out as `generate`'s
own cache (which `generate` continues from), carrying what vlmspec needs to continue from it with its draft too."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import Cache, DynamicLayer

from ..adapters import ModelAdapter
from ..engine.prefix import CachedPrefix, Continuation
from ..errors import UnsupportedGenerationError


@dataclass
class CachedRow:
    """One row of a `SpeculativeCache`: its left padding, and what its models hold of its own tokens from there."""

    pad: int
    continuation: Continuation


class SpeculativeCache(DynamicCache):
    """The target's keys and values for the returned sequences (all but each one's last token), as `generate`'s
    cache holds them: per layer `(B, kv heads, S - 1, head dim)` for sequences `(B, S)`, row b's tokens from its
    left padding on. Where `generate` would hold its padding's keys (the left padding, and after a row that ended
    early) it holds zeros, which the attention mask hides.

    `rows` keeps per row what vlmspec continues from, the draft's keys among them, while the cache is as vlmspec
    returned it (`generate` going on from it grows it, after which vlmspec reads it as any other cache)."""

    def __init__(self, config: PretrainedConfig, rows: list[CachedRow], width: int):
        super().__init__(config=config)
        self.rows = rows
        self.width = width
        for index in range(len(rows[0].continuation.target.layers)):
            keys, values = _stacked(rows, index, width)
            self.update(keys, values, index)
        self._made = [layer.keys for layer in self.layers]

    @property
    def intact(self) -> bool:
        """Whether it still holds what vlmspec returned: every change (a token added, rows repeated, a crop) gives a
        layer new keys."""
        return all(layer.keys is made for layer, made in zip(self.layers, self._made, strict=True))


def returned_cache(config: PretrainedConfig, continuations: list[Continuation], pads: list[int]) -> SpeculativeCache:
    """The cache returned with sequences whose rows hold `continuations` after their `pads` of left padding."""
    width = max(pad + c.target.covers for pad, c in zip(pads, continuations, strict=True))
    rows = [CachedRow(pad, c) for pad, c in zip(pads, continuations, strict=True)]
    return SpeculativeCache(config, rows, width)


def _stacked(rows: list[CachedRow], index: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index`'s keys and values of every row, `(B, kv heads, width, head dim)`, each row's after its padding."""
    first_keys, first_values = rows[0].continuation.target.layers[index]
    if len(rows) == 1 and rows[0].pad == 0:
        return first_keys, first_values
    keys = first_keys.new_zeros(len(rows), first_keys.shape[1], width, first_keys.shape[3])
    values = first_values.new_zeros(len(rows), first_values.shape[1], width, first_values.shape[3])
    for b, row in enumerate(rows):
        own_keys, own_values = row.continuation.target.layers[index]
        keys[b, :, row.pad : row.pad + own_keys.shape[2]] = own_keys[0]
        values[b, :, row.pad : row.pad + own_values.shape[2]] = own_values[0]
    return keys, values


def row_continuations(cache: Cache, pads: list[int], lengths: list[int], adapter: ModelAdapter) -> list[Continuation]:
    """What each row of a call goes on from: row b (after `pads[b]` of left padding, `lengths[b]` tokens of its own)
    from the cache's entries after its padding. A cache vlmspec returned (and nobody changed since) gives the draft's
    keys too and each row's own positions; any other (a `DynamicCache` from `generate`) gives the target's, positioned
    as `generate` positions them, and the draft reads the row's tokens again."""
    if not isinstance(cache, Cache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise UnsupportedGenerationError(
            f"generate(): past_key_values must be a DynamicCache (as generate returns), got {type(cache).__name__}"
        )
    cached = cache.get_seq_length()
    batch = cache.layers[0].keys.shape[0] if cached else 0
    if batch != len(pads):
        raise ValueError(f"past_key_values holds {batch} rows, the inputs {len(pads)}")
    for b, (pad, length) in enumerate(zip(pads, lengths, strict=True)):
        if cached < pad or cached - pad >= length:
            raise ValueError(
                f"row {b}'s cache holds {cached} positions, but its inputs are {pad} padding then {length} tokens: "
                "pass the inputs the cache was made for followed by at least one new token"
            )
    if isinstance(cache, SpeculativeCache) and cache.intact:
        return _own_rows(cache, pads)
    return [
        Continuation(
            CachedPrefix(
                [(layer.keys[b : b + 1, :, pad:], layer.values[b : b + 1, :, pad:]) for layer in cache.layers],
                cached - pad,
                cached - pad + adapter.position_offset(b),
            )
        )
        for b, pad in enumerate(pads)
    ]


def _own_rows(cache: SpeculativeCache, pads: list[int]) -> list[Continuation]:
    """The rows of a cache vlmspec returned, refused where the call's padding moved a row, or where a row ended before
    the longest: `generate`'s cache holds its padding tokens' keys there, which vlmspec never computed."""
    for b, (row, pad) in enumerate(zip(cache.rows, pads, strict=True)):
        if pad != row.pad:
            raise ValueError(f"row {b} of past_key_values starts after {row.pad} padding, its inputs after {pad}")
        short = cache.width - row.pad - row.continuation.target.covers
        if short:
            raise UnsupportedGenerationError(
                f"generate(): past_key_values: row {b} ended {short} tokens before the longest, where generate's "
                "cache holds its padding tokens' keys, which vlmspec never computed: go on from each row's own call"
            )
    return [row.continuation for row in cache.rows]
