"""The KV cache a prompt pass writes: every layer's keys and values in one preallocated slab per device, from which
the batch's rows (`RowCache`) take their prompts.
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer

#: Room kept past the prompt and the token budget for a step's tree nodes and pending tokens.
TREE_ROOM = 160


def check_cache(config: PretrainedConfig) -> None:
    """Tree decoding rewrites cache entries in place; sliding-window and quantised layers cannot be rewritten so."""
    for layer in DynamicCache(config=config).layers:
        if type(layer) is not DynamicLayer or isinstance(layer, DynamicSlidingWindowLayer):
            raise NotImplementedError(
                f"speculative decoding needs plain full-attention cache layers, got {type(layer).__name__}"
            )


class _SlabLayer(CacheLayerMixin):
    """One layer of a `SlabCache`: writes its new keys and values at the cache's length, returns views up to them."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: SlabCache, index: int):
        super().__init__()
        self.cache = cache
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.cache.length
        end = start + key_states.shape[-2]
        keys, values = self.cache.layer_slab(self.index, key_states, end)
        keys[:, :, start:end].copy_(key_states)
        values[:, :, start:end].copy_(value_states)
        self.cache.written = end
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        self.is_initialized = True
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.length

    def get_max_length(self) -> int:
        return self.cache.capacity


class SlabCache(Cache):
    """Keys and values of all layers as one tensor per device, `(2 * layers there, B, kv heads, capacity, head dim)`.

    Slabs are allocated at the first write on their device, for the room asked for, and grow by doubling when a
    forward writes more. `length` is the number of cached positions; a forward writes at `length` on and `settle()`
    makes what it wrote part of the cache.
    """

    def __init__(self, layer_devices: list[torch.device], capacity: int):
        self.layer_devices = [torch.device(d) for d in layer_devices]
        super().__init__(layers=[_SlabLayer(self, i) for i in range(len(layer_devices))])
        self.capacity = capacity
        self.length = 0
        self.written = 0
        self._slabs: dict[torch.device, torch.Tensor] = {}
        devices = sorted(set(self.layer_devices), key=str)
        self._members = {d: [i for i, ld in enumerate(self.layer_devices) if ld == d] for d in devices}
        self._place = {i: members.index(i) for members in self._members.values() for i in members}

    def stored(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s keys and values as stored, `(B, kv heads, capacity, head dim)` each (views of its device's
        slab)."""
        slab = self._slabs[self.layer_devices[index]]
        place = 2 * self._place[index]
        return slab[place], slab[place + 1]

    def layer_slab(self, index: int, like: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s full-capacity keys and values, allocating or growing its device's slab to hold `end`."""
        device = self.layer_devices[index]
        slab = self._slabs.get(device)
        if slab is not None and not _holds(slab, like):
            slab = None
        if slab is None or end > slab.shape[3]:
            self._slabs[device] = slab = self._allocate(device, like, end, slab)
        place = 2 * self._place[index]
        return slab[place], slab[place + 1]

    def _allocate(self, device: torch.device, like: torch.Tensor, end: int, old: torch.Tensor | None) -> torch.Tensor:
        capacity = max(self.capacity, end) if old is None else max(end, 2 * old.shape[3])
        batch, heads, _, dim = like.shape
        # The keys arrive where the layer computes (an offloaded layer's weights may sit elsewhere).
        slab = torch.zeros(
            2 * len(self._members[device]), batch, heads, capacity, dim, dtype=like.dtype, device=like.device
        )
        if old is not None:
            slab[:, :, :, : self.length].copy_(old[:, :, :, : self.length])
        self.capacity = max(self.capacity, capacity)
        return slab

    def settle(self) -> int:
        """Take in what the last forward wrote; returns the new length."""
        self.length = self.written
        return self.length


def fixed_capacity(positions: int) -> int:
    """A cache capacity of at least `positions` from a small set (eight sizes per doubling, multiples of 256), so
    compiled forwards meet few distinct shapes and at most an eighth of the cache goes unused."""
    power = 1 << max(0, math.ceil(math.log2(max(positions, 1))))
    step = max(256, power // 16)
    return -(-positions // step) * step


def _holds(slab: torch.Tensor, like: torch.Tensor) -> bool:
    """Whether `slab` can take keys like `like` `(B, kv heads, q, head dim)`: the same dtype, device and sizes."""
    return (
        slab.dtype == like.dtype
        and slab.device == like.device
        and slab.shape[1:3] == like.shape[:2]
        and slab.shape[4] == like.shape[3]
    )
