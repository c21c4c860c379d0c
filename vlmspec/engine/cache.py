"""The KV cache the engine owns: every layer's keys and values in one preallocated slab per device, written at
positions; keeping a step's accepted path is one gather over all layers at once, not a concatenation per forward.
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

    def bind(self, keys: torch.Tensor, values: torch.Tensor, cursor: torch.Tensor) -> None:
        """Write fixed-shape from now on: at `cursor` on, into these full-capacity `keys` and `values`."""
        self.slab_keys, self.slab_values, self.cursor = keys, values, cursor

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cache.fixed:
            positions = self.cursor + torch.arange(key_states.shape[-2], device=key_states.device)
            self.slab_keys.index_copy_(2, positions, key_states)
            self.slab_values.index_copy_(2, positions, value_states)
            return self.slab_keys, self.slab_values
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
        if self.cache.fixed:
            return self.cache.capacity, 0
        return self.cache.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.length

    def get_max_length(self) -> int:
        return self.cache.capacity


class SlabCache(Cache):
    """Keys and values of all layers as one tensor per device, `(2 * layers there, B, kv heads, capacity, head dim)`.

    Slabs are allocated at the first write on their device, for the room the call asked for (the prompt, the token
    budget and a tree), and grow by doubling when a step feeds more: SAGE's padded levels on an accelerator feed
    the draft up to D x 64 slots, so its draft slab grows once or twice in a long call. `length` is the number of
    cached positions; a forward writes at `length` on and `settle()` makes what it wrote part of the cache.

    After `fix()` (for compiled forwards) every layer writes at a device-side cursor and returns its whole slab, so
    a forward's shapes depend only on how many tokens it feeds: `reserve()` makes room and sets the cursor first,
    `advance()` takes in what it wrote; masks then span `capacity`, which is rounded up to few distinct sizes.
    """

    def __init__(self, layer_devices: list[torch.device], capacity: int, reuse: SlabCache | None = None):
        self.layer_devices = [torch.device(d) for d in layer_devices]
        super().__init__(layers=[_SlabLayer(self, i) for i in range(len(layer_devices))])
        self.capacity = capacity
        self.length = 0
        self.written = 0
        self._slabs: dict[torch.device, torch.Tensor] = {}
        devices = sorted(set(self.layer_devices), key=str)
        self._members = {d: [i for i, ld in enumerate(self.layer_devices) if ld == d] for d in devices}
        self._place = {i: members.index(i) for members in self._members.values() for i in members}
        self.fixed = False
        self._cursors: dict[torch.device, torch.Tensor] = {}
        if reuse is not None and reuse.layer_devices == self.layer_devices:
            # Compiled forwards (CUDA graphs above all) keep running on the same buffers from call to call.
            self._slabs, self._cursors = reuse._slabs, reuse._cursors
            self.capacity = max([capacity] + [slab.shape[3] for slab in self._slabs.values()])

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
            self._cursors.pop(device, None)
        place = 2 * self._place[index]
        return slab[place], slab[place + 1]

    def _allocate(self, device: torch.device, like: torch.Tensor, end: int, old: torch.Tensor | None) -> torch.Tensor:
        if old is None:
            capacity = max(self.capacity, end)
        else:
            capacity = end if self.fixed else max(end, 2 * old.shape[3])
        if self.fixed:
            capacity = fixed_capacity(capacity)
        batch, heads, _, dim = like.shape
        # The keys arrive where the layer computes (an offloaded layer's weights may sit elsewhere). Zeros, not
        # garbage: fixed-shape attention multiplies unwritten positions by a zero weight, and 0 x NaN is NaN.
        slab = torch.zeros(
            2 * len(self._members[device]), batch, heads, capacity, dim, dtype=like.dtype, device=like.device
        )
        if old is not None:
            slab[:, :, :, : self.length].copy_(old[:, :, :, : self.length])
        self.capacity = max(self.capacity, capacity)
        return slab

    def fix(self) -> None:
        """Switch to fixed-shape writes (after the prompt): whole slabs out, a cursor on each device in."""
        self.fixed = True
        for device in self._slabs:
            self._bind(device)

    def reserve(self, end: int) -> None:
        """Fixed-shape mode: make room for positions up to `end` (growing to a rounded size, eagerly, outside any
        compiled forward) and point every layer's writes at `length`."""
        for device, slab in list(self._slabs.items()):
            if slab.shape[3] < end:
                self._slabs[device] = self._allocate(device, slab[0, :, :, :1], end, slab)
                self._cursors.pop(device, None)
        for device in self._slabs:
            if device not in self._cursors:
                self._bind(device)
            self._cursors[device].fill_(self.length)

    def _bind(self, device: torch.device) -> None:
        """Point the layers on `device` at their views of its slab and at its cursor (made if missing); on CUDA the
        views are marked static, so CUDA graphs may write into them."""
        slab = self._slabs[device]
        if device not in self._cursors:
            self._cursors[device] = torch.zeros((), dtype=torch.long, device=slab.device)
        for index in self._members[device]:
            place = 2 * self._place[index]
            keys, values = slab[place], slab[place + 1]
            if slab.device.type == "cuda":
                torch._dynamo.mark_static_address(keys)
                torch._dynamo.mark_static_address(values)
            self.layers[index].bind(keys, values, self._cursors[device])

    def advance(self, count: int) -> int:
        """Fixed-shape mode: take in the first `count` positions the last forward wrote; returns the new length."""
        self.written = self.length + count
        return self.settle()

    def settle(self) -> int:
        """Take in what the last forward wrote; returns the new length."""
        self.length = self.written
        return self.length

    def keep(self, start: int, keep: torch.Tensor) -> int:
        """Of the entries from `start` on, keep those at offsets `keep` (ascending), moved to `start`, in every layer
        at once: one gather and one copy per device. Returns the new length."""
        n = keep.shape[0]
        if n:
            for slab in self._slabs.values():
                source = slab.index_select(3, keep.to(slab.device) + start)
                slab[:, :, :, start : start + n].copy_(source)
        self.length = self.written = start + n
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
