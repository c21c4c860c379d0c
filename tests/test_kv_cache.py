"""The batch's KV cache on made-up tensors: rows come in at their own lengths, write at their own ends, keep their
own accepted paths and leave without disturbing the others."""

from __future__ import annotations

import torch

from vlmspec.engine.kv_cache import RowCache
from vlmspec.engine.prompt_cache import SlabCache, fixed_capacity

CPU = torch.device("cpu")
LAYERS, HEADS, DIM = 2, 2, 3


def prefilled(length: int, seed: int) -> SlabCache:
    """A batch-1 slab cache holding `length` positions of recognisable values."""
    cache = SlabCache([CPU] * LAYERS, length + 4)
    keys = torch.randn(1, HEADS, length, DIM, generator=torch.Generator().manual_seed(seed))
    for layer in cache.layers:
        layer.update(keys, keys + 100)
    cache.settle()
    return cache


def row_keys(cache: RowCache, row: int, layer: int = 0) -> torch.Tensor:
    """Row `row`'s cached keys of `layer`, `(kv heads, length, head dim)`."""
    keys, _ = cache.layer_slab(layer)
    return keys[row, :, : cache.lengths[row]]


def test_append_takes_a_prefilled_sequence_in_as_a_new_row_at_its_own_length():
    first, second = prefilled(5, 0), prefilled(3, 1)
    cache = RowCache([CPU] * LAYERS)
    assert cache.append(first, room=8) == 0
    assert cache.append(second, room=8) == 1
    assert cache.lengths == [5, 3]
    for layer in range(LAYERS):
        expected, _ = first.layer_slab(layer, torch.zeros(1, HEADS, 1, DIM), 5)
        assert torch.equal(row_keys(cache, 0, layer), expected[0, :, :5])
    second_keys, second_values = second.layer_slab(1, torch.zeros(1, HEADS, 1, DIM), 3)
    keys, values = cache.layer_slab(1)
    assert torch.equal(keys[1, :, :3], second_keys[0, :, :3])
    assert torch.equal(values[1, :, :3], second_values[0, :, :3])


def test_a_forward_writes_each_row_at_its_own_end():
    cache = RowCache([CPU] * LAYERS)
    cache.append(prefilled(5, 0), room=8)
    cache.append(prefilled(2, 1), room=8)
    cache.prepare(3)
    new = torch.arange(2 * HEADS * 3 * DIM, dtype=torch.float32).view(2, HEADS, 3, DIM)
    keys, _ = cache.layers[0].update(new, new)
    assert keys.shape[2] == 5 + 3
    cache.commit([3, 1])
    assert cache.lengths == [8, 3]
    assert torch.equal(row_keys(cache, 0)[:, 5:], new[0])
    assert torch.equal(row_keys(cache, 1)[:, 2:], new[1, :, :1])


def test_keep_moves_each_rows_kept_offsets_to_its_own_start():
    cache = RowCache([CPU] * LAYERS)
    cache.append(prefilled(6, 0), room=8)
    cache.append(prefilled(4, 1), room=8)
    before = [row_keys(cache, b).clone() for b in range(2)]
    cache.keep_rows([2, 1], torch.tensor([[0, 2, 3], [1, 0, 0]]), [3, 1])
    assert cache.lengths == [5, 2]
    assert torch.equal(row_keys(cache, 0), torch.cat([before[0][:, :2], before[0][:, [2, 4, 5]]], dim=1))
    assert torch.equal(row_keys(cache, 1), torch.cat([before[1][:, :1], before[1][:, [2]]], dim=1))


def test_keep_with_nothing_kept_cuts_a_row_back_to_its_start():
    cache = RowCache([CPU] * LAYERS)
    cache.append(prefilled(6, 0), room=8)
    cache.append(prefilled(4, 1), room=8)
    before = row_keys(cache, 0).clone()
    cache.keep_rows([3, 4], torch.tensor([[1], [0]]), [1, 0])
    assert cache.lengths == [4, 4]
    assert torch.equal(row_keys(cache, 0), torch.cat([before[:, :3], before[:, [4]]], dim=1))


def test_drop_frees_finished_rows_slots_for_the_last_rows():
    cache = RowCache([CPU] * LAYERS, slots=4)
    for seed, n in enumerate((3, 5, 2, 4)):
        cache.append(prefilled(n, seed), room=4)
    before = [row_keys(cache, b).clone() for b in range(4)]
    order = cache.drop([0, 2])
    assert order == [3, 1]
    assert cache.rows == 2
    assert cache.lengths == [4, 5]
    assert all(torch.equal(row_keys(cache, b), before[old]) for b, old in enumerate(order))


def test_a_freed_slot_takes_the_next_sequence():
    cache = RowCache([CPU] * LAYERS, slots=2)
    cache.append(prefilled(3, 0), room=4)
    cache.append(prefilled(5, 1), room=4)
    kept = row_keys(cache, 1).clone()
    cache.drop([0])
    incoming = prefilled(2, 2)
    assert cache.append(incoming, room=4) == 1
    assert cache.slots == 2
    assert torch.equal(row_keys(cache, 0), kept)
    assert torch.equal(row_keys(cache, 1), incoming.layer_slab(0, torch.zeros(1, HEADS, 1, DIM), 2)[0][0, :, :2])


def test_rows_grow_past_the_room_they_came_with():
    cache = RowCache([CPU] * LAYERS)
    cache.append(prefilled(3, 0), room=1)
    before = row_keys(cache, 0).clone()
    cache.prepare(10)
    assert cache.capacity >= 13
    assert torch.equal(row_keys(cache, 0), before)


def test_a_fixed_cache_runs_forwards_over_a_bucket_of_slots_at_its_whole_capacity():
    cache = RowCache([CPU] * LAYERS, slots=3, fixed=True)
    for seed, n in enumerate((5, 2, 4)):
        cache.append(prefilled(n, seed), room=4)
    assert cache.slots == 4 and cache.capacity == fixed_capacity(5 + 4) == 256
    cache.prepare(2)
    assert cache.bucket == 4 and cache.span == cache.capacity
    new = torch.arange(4 * HEADS * 2 * DIM, dtype=torch.float32).view(4, HEADS, 2, DIM) + 1
    keys, _ = cache.layers[0].update(new, new)
    assert keys.shape == (4, HEADS, cache.capacity, DIM)
    cache.commit([2, 1, 0])
    assert cache.lengths == [7, 3, 4]
    assert torch.equal(row_keys(cache, 0)[:, 5:], new[0])
    assert torch.equal(row_keys(cache, 1)[:, 2:], new[1, :, :1])
    assert torch.equal(keys[3, :, :2], new[3])  # the free slot writes at its own start, where no row reads


def test_a_fixed_cache_shrinks_its_bucket_as_rows_leave_and_grows_to_rounded_capacities():
    cache = RowCache([CPU] * LAYERS, slots=4, fixed=True)
    for seed in range(3):
        cache.append(prefilled(3, seed), room=4)
    cache.drop([0, 1])
    cache.prepare(1)
    assert cache.bucket == 1
    cache.prepare(256)
    assert cache.capacity == fixed_capacity(3 + 256) == 512
