"""The KV cache of a batch of sequences decoded together: one slab per device, each row with its own length.

Rows are independent sequences: each holds its keys from index 0 up to its own length, and a forward writes every
row's new keys at that row's length on. The slab has a slot per row the batch may hold; the rows in flight are the
first slots, so forwards run over them alone. Keeping a step's accepted paths is one gather over all layers per
device; a prefilled sequence is copied into the next free slot, and a finished row's slot takes the last row.

A `fixed` cache serves compiled forwards: they run over a bucket of slots (`row_bucket`: the rows in flight rounded
up to a power of two, the free slots feeding padding) and return every slot's keys up to a rounded capacity, so a
forward's shapes depend only on its bucket, its padded token count and the capacity.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .compiled import row_bucket
from .device_tensors import arange, host_values
from .prompt_cache import SlabCache, fixed_capacity
from .schedule import compaction


class _RowLayer(CacheLayerMixin):
    """One layer of a `RowCache`: writes each row's new keys at that row's write positions (`write`, set by
    `RowCache.prepare`), returns the keys up to the forward's span (the longest row's end), or a fixed cache's
    whole bucket of slots (`bound`)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: RowCache, index: int):
        super().__init__()
        self.cache = cache
        self.index = index
        self.write: torch.Tensor | None = None
        self.bound: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.bound if self.cache.fixed else self.cache.layer_slab(self.index)
        index = self.write[:, None, :, None].expand_as(key_states)
        keys.scatter_(2, index, key_states)
        values.scatter_(2, index, value_states)
        if self.cache.fixed:
            return keys, values
        span = self.cache.span
        return keys[:, :, :span], values[:, :, :span]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.span, 0

    def get_seq_length(self) -> int:
        return max(self.cache.lengths, default=0)

    def get_max_length(self) -> int:
        return self.cache.capacity


class RowCache(Cache):
    """Keys and values of all layers for B rows, `(2 * layers there, B, kv heads, capacity, head dim)` per device.

    `lengths` (host) are the rows' cached positions. Before a forward, `prepare(q)` sets where each row writes its
    `q` fed tokens (from its length on; a row feeding fewer writes its padding past its own end, where nothing reads
    it) and the span the forward attends over; `commit(counts)` takes the first `counts[b]` in. A `fixed` cache's
    forwards run over `bucket` slots (free slots write at their own start, where nothing reads) and span its
    `capacity`, which grows to rounded sizes only.
    """

    def __init__(
        self, layer_devices: list[torch.device], slots: int = 1, fixed: bool = False, reuse: RowCache | None = None
    ):
        self.fixed = fixed
        self.slots = row_bucket(slots) if fixed else slots
        self.layer_devices = [torch.device(d) for d in layer_devices]
        super().__init__(layers=[_RowLayer(self, i) for i in range(len(layer_devices))])
        devices = sorted(set(self.layer_devices), key=str)
        self._members = {d: [i for i, ld in enumerate(self.layer_devices) if ld == d] for d in devices}
        self._place = {i: members.index(i) for members in self._members.values() for i in members}
        self._slabs: dict[torch.device, torch.Tensor] = {}
        self.lengths: list[int] = []
        self.capacity = 0
        self.span = 0
        self.bucket = 0
        self.starts: torch.Tensor | None = None
        self._views: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        if fixed and reuse is not None and reuse.fixed and reuse.layer_devices == self.layer_devices:
            # Compiled forwards (CUDA graphs above all) keep running on the same buffers from batch to batch.
            self._slabs, self._views, self.capacity = reuse._slabs, reuse._views, reuse.capacity
            self.slots = max(self.slots, reuse.slots)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def layer_slab(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s full-capacity keys and values of the rows in flight `(B, kv heads, capacity, head dim)`."""
        slab = self._slabs[self.layer_devices[index]]
        place, rows = 2 * self._place[index], self.rows
        return slab[place, :rows], slab[place + 1, :rows]

    def prepare(self, q: int) -> None:
        """Make room for `q` more tokens in every row and point the next forward's writes at the rows' ends (a fixed
        cache's free slots of the bucket at their own start). `starts` (B or bucket,) are those ends."""
        end = max(self.lengths) + q
        self.reserve(end)
        device = next(iter(self._slabs.values())).device
        lengths = self.lengths
        if self.fixed:
            self.bucket = row_bucket(self.rows)
            lengths = lengths + [0] * (self.bucket - self.rows)
        self.starts = host_values(lengths, device)
        write = self.starts[:, None] + arange(q, device)
        writes = {d: write.to(d) for d in self._slabs}
        views = self._bound_views() if self.fixed else None
        for index, layer in enumerate(self.layers):
            layer.write = writes[self.layer_devices[index]]
            if views is not None:
                layer.bound = views[index]
        self.span = self.capacity if self.fixed else end

    def _bound_views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values over the bucket's slots at full capacity: made once per bucket and slab (a
        compiled forward's graph is kept for the very tensors it saw; on CUDA they are marked static, so its graphs
        write into them in place)."""
        views = self._views.get(self.bucket)
        if views is None:
            views = []
            for index in range(len(self.layers)):
                slab = self._slabs[self.layer_devices[index]]
                place = 2 * self._place[index]
                pair = (slab[place, : self.bucket], slab[place + 1, : self.bucket])
                if slab.device.type == "cuda":
                    for tensor in pair:
                        torch._dynamo.mark_static_address(tensor)
                views.append(pair)
            self._views[self.bucket] = views
        return views

    def commit(self, counts: list[int]) -> None:
        """Take in the first `counts[b]` tokens each row fed to the last forward."""
        self.lengths = [length + count for length, count in zip(self.lengths, counts, strict=True)]

    def reserve(self, end: int) -> None:
        """Grow every slab (by doubling at least, a fixed one to a rounded size) so each row can hold `end`
        positions."""
        if end <= self.capacity:
            return
        capacity = fixed_capacity(end) if self.fixed else max(end, 2 * self.capacity)
        self._views = {}
        for device, slab in self._slabs.items():
            slab = slab[:, : self.rows]
            grown = slab.new_zeros(slab.shape[0], self.slots, slab.shape[2], capacity, slab.shape[4])
            grown[:, : self.rows, :, : self.capacity].copy_(slab)
            self._slabs[device] = grown
        self.capacity = capacity

    def append(self, source: SlabCache, room: int, source_row: int = 0, start: int = 0) -> int:
        """Take in a prefilled sequence as a new last row with `room` more positions to come: row `source_row` of
        `source` from position `start` on (a left-padded batch's row starts after its padding). Returns its row."""
        length, row = source.length - start, self.rows
        self.reserve(length + room)
        for device, slab in source._slabs.items():
            own = self._slabs.get(device)
            if own is None or own.shape[1] <= row:
                own = self._slabs[device] = self._with_slots(own, slab, max(self.slots, row + 1))
            own[:, row, :, :length].copy_(slab[:, source_row, :, start : start + length])
        self.lengths.append(length)
        return row

    def _with_slots(self, own: torch.Tensor | None, like: torch.Tensor, slots: int) -> torch.Tensor:
        """A slab with `slots` rows at the current capacity, holding `own`'s rows."""
        slots = row_bucket(slots) if self.fixed else slots
        shape = (like.shape[0], slots, like.shape[2], self.capacity, like.shape[4])
        grown = like.new_zeros(shape)
        if own is not None:
            grown[:, : own.shape[1]].copy_(own)
        self.slots = slots
        self._views = {}
        return grown

    def drop(self, rows: list[int]) -> list[int]:
        """Remove `rows` (finished sequences) so later forwards cost nothing for them: each freed slot takes the last
        row in flight. Returns the new order as old row indices."""
        moves, order = compaction(self.rows, rows)
        lengths = list(self.lengths)
        for source, slot in moves:
            for slab in self._slabs.values():
                slab[:, slot, :, : lengths[source]].copy_(slab[:, source, :, : lengths[source]])
            lengths[slot] = lengths[source]
        self.lengths = [self.lengths[b] for b in order]
        return order

    def keep_rows(self, starts: list[int], offsets: torch.Tensor, counts: list[int]) -> None:
        """In each row b, of the entries from `starts[b]` on keep those at its first `counts[b]` `offsets` (B, W)
        (ascending), moved to `starts[b]`; the row's length becomes `starts[b] + counts[b]`. One gather and one
        scatter per device, whatever the rows."""
        if offsets.shape[1]:
            device = offsets.device
            begin = host_values(starts, device)[:, None]
            source = begin + offsets
            target = begin + arange(offsets.shape[1], device)
            rows = arange(self.rows, device)[:, None]
            for slab in self._slabs.values():
                view = (
                    slab[:, : self.rows].transpose(2, 3).transpose(0, 2)
                )  # (capacity, B, 2L, H, D) over the same storage
                r, s, t = rows.to(slab.device), source.to(slab.device), target.to(slab.device)
                view[t, r] = view[s, r]  # advanced indexing copies: the sources are read before any is written
        self.lengths = [start + count for start, count in zip(starts, counts, strict=True)]
