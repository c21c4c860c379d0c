"""The KV cache of one model: every layer's keys and values in one slab per device, a slot per row the batch may
hold, each row with its own length. A prompt pass writes new rows' keys straight into free slots (`PromptWriter`),
and decoding forwards write at each row's end: a prompt's keys are written once, where its row decodes from.

Rows are independent sequences: each holds its keys from index 0 up to its own length, and a forward writes every
row's new keys at that row's length on. The rows in flight are the first slots, so forwards run over them alone.
Keeping a step's accepted paths is one gather over all layers per device; a finished row's slot takes the last row.

A `fixed` cache serves compiled forwards: they run over a bucket of slots (`row_bucket`: the rows in flight rounded
up to a power of two, the free slots feeding padding) and return every slot's keys up to a rounded capacity, so a
forward's shapes depend only on its bucket, its padded token count and the capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, DynamicSlidingWindowLayer

from ..device_tensors import arange, host_values
from .compiled import fixed_capacity, row_bucket
from .schedule import compaction

#: Room kept past the prompt and the token budget for a step's tree nodes and pending tokens.
TREE_ROOM = 160


def check_cache(config: PretrainedConfig) -> None:
    """Tree decoding rewrites cache entries in place; sliding-window and quantised layers cannot be rewritten so."""
    for layer in DynamicCache(config=config).layers:
        if type(layer) is not DynamicLayer or isinstance(layer, DynamicSlidingWindowLayer):
            raise NotImplementedError(
                f"speculative decoding needs plain full-attention cache layers, got {type(layer).__name__}"
            )


@dataclass
class PromptSlot:
    """A prompt a pass wrote into a `RowCache`: the slots `held` hold its keys at indices 0 to `length` (the slot the
    pass wrote and the rows that took it in, each until a later write takes it), and its token at index i sits at
    position `i + offset`. A tapped target's pass keeps the prompt's `features` (L, 3H) for a draft head."""

    held: list[int]
    length: int
    offset: int = 0
    features: torch.Tensor | None = None

    @property
    def slot(self) -> int | None:
        """The first slot holding the prompt, or None when no slot holds it any more."""
        return min(self.held, default=None)


class _SlabLayer(CacheLayerMixin):
    """One layer `index` of a cache whose keys and values live in a `RowCache`'s slabs (full attention, rewritten in
    place, so neither sliding nor compileable as transformers' own layers are)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True


class _RowLayer(_SlabLayer):
    """One layer of a `RowCache`: writes each row's new keys at that row's write positions (`write`, set by
    `RowCache.prepare`; a fixed cache's from its rows' `starts` on, made inside the forward, so that a compiled one
    makes them in its graph), returns the keys up to the forward's span (the longest row's end), or a fixed cache's
    whole bucket of slots (`bound`)."""

    def __init__(self, cache: RowCache, index: int):
        super().__init__(index)
        self.cache = cache
        self.write: torch.Tensor | None = None
        self.bound: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fixed = self.cache.fixed
        keys, values = self.bound if fixed else self.cache.layer_slab(self.index)
        if fixed:
            q, device = key_states.shape[2], key_states.device
            write = self.cache.starts.to(device)[:, None] + torch.arange(q, device=device)
        else:
            write = self.write
        index = write[:, None, :, None].expand_as(key_states)
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
    """Keys and values of all layers for B rows, `(2 * layers there, slots, kv heads, capacity, head dim)` per device
    (allocated at the first write, on the device the layer computes on).

    `lengths` (host) are the rows' cached positions. `writer(lengths, room)` is the cache a prompt pass over new rows
    runs on, `take(prompt, room)` makes a written prompt a row. Before a forward, `prepare(q)` sets where each row
    writes its `q` fed tokens (from its length on; a row feeding fewer writes its padding past its own end, where
    nothing reads it) and the span the forward attends over; `commit(counts)` takes the first `counts[b]` in. A
    `fixed` cache's forwards run over `bucket` slots (free slots write at their own start, where nothing reads) and
    span its `capacity`, which grows to rounded sizes only.
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
        self._written: list[PromptSlot] = []
        if fixed and reuse is not None and reuse.fixed and reuse.layer_devices == self.layer_devices:
            # Compiled forwards (CUDA graphs above all) keep running on the same buffers from batch to batch.
            # A larger batch grows them to its own slots (the views of every bucket made again).
            slots, self.slots = self.slots, reuse.slots
            self._slabs, self._views, self.capacity = reuse._slabs, reuse._views, reuse.capacity
            self._grow_slots(slots)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def layer_slab(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s full-capacity keys and values of the rows in flight `(B, kv heads, capacity, head dim)`."""
        slab = self._slabs[self.layer_devices[index]]
        place, rows = 2 * self._place[index], self.rows
        return slab[place, :rows], slab[place + 1, :rows]

    def slot_slab(self, index: int, like: torch.Tensor, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s full-capacity keys and values of slots `first` to `first + count`, `(count, kv heads,
        capacity, head dim)`; the layer's device gets its slab at the first write, shaped and placed as `like`
        `(B, kv heads, q, head dim)` (an offloaded layer's keys arrive where it computes)."""
        device = self.layer_devices[index]
        slab = self._slabs.get(device)
        if slab is None:
            shape = (2 * len(self._members[device]), self.slots, like.shape[1], self.capacity, like.shape[3])
            slab = self._slabs[device] = like.new_zeros(shape)
            self._views = {}
        place = 2 * self._place[index]
        return slab[place, first : first + count], slab[place + 1, first : first + count]

    def entries(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every layer's first `length` keys and values in `slot`, `(1, kv heads, length, head dim)`."""
        entries = []
        for index, device in enumerate(self.layer_devices):
            slab, place = self._slabs[device], 2 * self._place[index]
            keys, values = slab[place, slot : slot + 1, :, :length], slab[place + 1, slot : slot + 1, :, :length]
            entries.append((keys.clone(), values.clone()))
        return entries

    def writer(self, lengths: list[int], room: int) -> PromptWriter:
        """The cache a prompt pass over new rows of `lengths` tokens runs on (a left-padded batch is as wide as its
        longest), each with `room` more positions to come: they go to the free slots from `rows` on, room reserved
        first. What those slots held is gone."""
        first = self.rows
        self.reserve(max(lengths) + room)
        self._grow_slots(first + len(lengths))
        self._forget(range(first, first + len(lengths)))
        return PromptWriter(self, first, lengths)

    @property
    def prompts_written(self) -> list[PromptSlot]:
        """The prompts the last pass wrote, followed as rows move."""
        return self._written

    def written(self, prompts: list[PromptSlot]) -> list[PromptSlot]:
        """Follow `prompts` (a pass's) as rows move, until a later write takes their slots; returns them. A later
        pass's prompts take their place."""
        self._forget(range(self.slots))
        self._written = prompts
        return prompts

    def take(self, prompt: PromptSlot, room: int) -> int:
        """Take in a written prompt as a new last row with `room` more positions to come: in place, or copied from a
        slot that holds it (a free one its pass wrote, or another row's: draws of one prompt share its pass). Returns
        its row."""
        row, source = self.rows, prompt.slot
        self.reserve(prompt.length + room)
        if source != row:
            self._grow_slots(row + 1)
            self._forget([row])
            for slab in self._slabs.values():
                slab[:, row, :, : prompt.length].copy_(slab[:, source, :, : prompt.length])
            prompt.held.append(row)
        self.lengths.append(prompt.length)
        return row

    def _forget(self, slots: Iterable[int]) -> None:
        """The followed prompts' copies in `slots` are overwritten."""
        taken = set(slots)
        for prompt in self._written:
            prompt.held = [slot for slot in prompt.held if slot not in taken]

    def _grow_slots(self, slots: int) -> None:
        """Make room for `slots` slots (a fixed cache for its bucket), keeping what every slot holds."""
        if slots <= self.slots:
            return
        self.slots = row_bucket(slots) if self.fixed else slots
        self._views = {}
        for device, slab in self._slabs.items():
            grown = slab.new_zeros(slab.shape[0], self.slots, *slab.shape[2:])
            grown[:, : slab.shape[1]].copy_(slab)
            self._slabs[device] = grown

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
            self._forget(range(self.rows, self.bucket))
        self.starts = host_values(lengths, device)
        if self.fixed:
            for layer, view in zip(self.layers, self._bound_views(), strict=True):
                layer.bound = view
        else:
            write = self.starts[:, None] + arange(q, device)
            writes = {d: write.to(d) for d in self._slabs}
            for index, layer in enumerate(self.layers):
                layer.write = writes[self.layer_devices[index]]
        self.span = self.capacity if self.fixed else end

    def _bound_views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values over the bucket's slots at full capacity: made once per bucket and slab (a
        compiled forward's graph is kept for the very tensors it saw; on CUDA they are marked static, so its graphs
        write into them in place). Their capacity and slots are marked dynamic: a graph serves every capacity and
        bucket."""
        views = self._views.get(self.bucket)
        if views is None:
            views = []
            for index in range(len(self.layers)):
                slab = self._slabs[self.layer_devices[index]]
                place = 2 * self._place[index]
                pair = (slab[place, : self.bucket], slab[place + 1, : self.bucket])
                for tensor in pair:
                    torch._dynamo.maybe_mark_dynamic(tensor, 2)
                    if self.bucket > 1:
                        torch._dynamo.maybe_mark_dynamic(tensor, 0)
                    if slab.device.type == "cuda":
                        torch._dynamo.mark_static_address(tensor)
                views.append(pair)
            self._views[self.bucket] = views
        return views

    def fixed_span(self) -> int:
        """The keys a fixed cache's forward attends over (its capacity), read off the bound keys' size: compiled, a
        dynamic size, so that one graph serves every capacity, where `capacity` (a host number) would be a constant
        of the graph."""
        return self.layers[0].bound[0].shape[2]

    def commit(self, counts: list[int]) -> None:
        """Take in the first `counts[b]` tokens each row fed to the last forward."""
        self.lengths = [length + count for length, count in zip(self.lengths, counts, strict=True)]

    def reserve(self, end: int) -> None:
        """Grow every slab (by doubling at least, a fixed one to a rounded size) so each slot can hold `end`
        positions, keeping the rows and the followed prompts."""
        if end <= self.capacity:
            return
        capacity = fixed_capacity(end) if self.fixed else max(end, 2 * self.capacity)
        self._views = {}
        used = max([self.rows, *(slot + 1 for prompt in self._written for slot in prompt.held)])
        for device, slab in self._slabs.items():
            grown = slab.new_zeros(*slab.shape[:3], capacity, slab.shape[4])
            grown[:, :used, :, : self.capacity].copy_(slab[:, :used])
            self._slabs[device] = grown
        self.capacity = capacity

    def drop(self, rows: list[int]) -> list[int]:
        """Remove `rows` (finished sequences) so later forwards cost nothing for them: each freed slot takes the last
        row in flight. Returns the new order as old row indices."""
        moves, order = compaction(self.rows, rows)
        lengths = list(self.lengths)
        for source, slot in moves:
            for slab in self._slabs.values():
                slab[:, slot, :, : lengths[source]].copy_(slab[:, source, :, : lengths[source]])
            lengths[slot] = lengths[source]
            self._forget([slot])
            for prompt in self._written:
                prompt.held = [slot if held == source else held for held in prompt.held]
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


class _PromptLayer(_SlabLayer):
    """One layer of a `PromptWriter`: writes the pass's keys and values into the new rows' slots."""

    def __init__(self, writer: PromptWriter, index: int):
        super().__init__(index)
        self.writer = writer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.is_initialized = True
        return self.writer.write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.writer.cache.capacity


class PromptWriter(Cache):
    """The cache one prompt pass (a single forward) over new rows runs on: it writes row b's keys into slot
    `first + b` of `cache`, at indices 0 to `lengths[b]`, and nowhere else.

    A left-padded batch feeds W tokens a row, row b's first `W - lengths[b]` padding: they are written after the
    row's own tokens (row b's token t at index `(t - pad) mod W`), where its decoding overwrites them before it reads
    there, so the rows need no moving after the pass.
    """

    def __init__(self, cache: RowCache, first: int, lengths: list[int]):
        super().__init__(layers=[_PromptLayer(self, i) for i in range(len(cache.layer_devices))])
        self.cache = cache
        self.first = first
        self.lengths = lengths
        self._rolls: dict[torch.device, torch.Tensor] = {}

    def write(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer `index`'s `keys` and `values` `(B, kv heads, W, head dim)` into the rows' slots; returns what
        the pass attends over: the stored keys and values when no row is padded, else `keys` and `values`."""
        stored_keys, stored_values = self.cache.slot_slab(index, keys, self.first, keys.shape[0])
        width = keys.shape[2]
        if all(length == width for length in self.lengths):
            stored_keys[:, :, :width].copy_(keys)
            stored_values[:, :, :width].copy_(values)
            return stored_keys[:, :, :width], stored_values[:, :, :width]
        roll = self._roll(width, keys.device)[:, None, :, None].expand_as(keys)
        stored_keys.scatter_(2, roll, keys)
        stored_values.scatter_(2, roll, values)
        return keys, values

    def _roll(self, width: int, device: torch.device) -> torch.Tensor:
        """Where each row's fed tokens go, `(B, W)`: token t of row b at `(t - pad_b) mod W` (made once per
        device)."""
        roll = self._rolls.get(device)
        if roll is None:
            pads = host_values([width - length for length in self.lengths], device)
            roll = self._rolls[device] = (arange(width, device)[None, :] - pads[:, None]) % width
        return roll

    def prompts(self, offsets: list[int]) -> list[PromptSlot]:
        """The rows' prompts as written, row b's positions `offsets[b]` past its indices; the cache follows them."""
        written = [
            PromptSlot([self.first + b], length, offset)
            for b, (length, offset) in enumerate(zip(self.lengths, offsets, strict=True))
        ]
        return self.cache.written(written)
