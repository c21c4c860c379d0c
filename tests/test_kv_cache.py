"""A model's KV cache on made-up tensors: a prompt pass writes new rows straight into free slots (a left-padded batch
too), rows decode at their own lengths, write at their own ends, keep their own accepted paths and leave without
disturbing the others; a prompt a row holds is copied into another row for another draw."""

from __future__ import annotations

import torch

from vlmspec.engine.compiled import fixed_capacity
from vlmspec.engine.kv_cache import PromptSlot, RowCache

CPU = torch.device("cpu")
LAYERS, HEADS, DIM = 2, 2, 3


def written(cache: RowCache, lengths: list[int], seed: int, room: int = 8) -> tuple[list[PromptSlot], torch.Tensor]:
    """One prompt pass over rows of `lengths` tokens (left-padded to the longest) writing recognisable keys (values:
    keys + 100); returns the prompts and each row's own keys `(B, kv heads, longest, head dim)`, padding first."""
    width = max(lengths)
    keys = torch.randn(len(lengths), HEADS, width, DIM, generator=torch.Generator().manual_seed(seed))
    writer = cache.writer(lengths, room)
    for layer in writer.layers:
        layer.update(keys, keys + 100)
    return writer.prompts([0] * len(lengths)), keys


def admitted(cache: RowCache, length: int, seed: int, room: int = 8) -> torch.Tensor:
    """A prompt of `length` positions written and taken in as the last row; returns its keys `(kv heads, length,
    head dim)`."""
    (prompt,), keys = written(cache, [length], seed, room)
    cache.take(prompt, room)
    return keys[0]


def row_keys(cache: RowCache, row: int, layer: int = 0) -> torch.Tensor:
    """Row `row`'s cached keys of `layer`, `(kv heads, length, head dim)`."""
    keys, _ = cache.layer_slab(layer)
    return keys[row, :, : cache.lengths[row]]


def test_a_prompt_pass_writes_each_prompt_where_its_row_decodes():
    cache = RowCache([CPU] * LAYERS)
    (first,), first_keys = written(cache, [5], 0)
    assert (first.slot, first.length) == (0, 5) and cache.rows == 0
    assert cache.take(first, room=8) == 0
    second_keys = admitted(cache, 3, 1)
    assert cache.lengths == [5, 3]
    for layer in range(LAYERS):
        assert torch.equal(row_keys(cache, 0, layer), first_keys[0])
    keys, values = cache.layer_slab(1)
    assert torch.equal(keys[1, :, :3], second_keys) and torch.equal(values[1, :, :3], second_keys + 100)


def test_an_unpadded_pass_attends_over_the_keys_it_stored():
    cache = RowCache([CPU] * LAYERS)
    writer = cache.writer([4], room=2)
    new = torch.full((1, HEADS, 4, DIM), 7.0)
    keys, _ = writer.layers[0].update(new, new)
    stored, _ = cache.slot_slab(0, new, 0, 1)
    assert keys.data_ptr() == stored.data_ptr() and torch.equal(keys, new)
    assert writer.get_seq_length() == 0 and writer.layers[0].get_mask_sizes(4) == (4, 0)
    assert cache.capacity >= 6


def test_a_left_padded_pass_leaves_each_rows_own_tokens_at_the_start_of_its_slot():
    cache = RowCache([CPU] * LAYERS, slots=2)
    prompts, keys = written(cache, [5, 3], 0)
    assert [(p.slot, p.length) for p in prompts] == [(0, 5), (1, 3)]
    for prompt in prompts:
        cache.take(prompt, room=8)
    assert torch.equal(row_keys(cache, 0), keys[0])
    assert torch.equal(row_keys(cache, 1), keys[1, :, 2:])


def test_rows_taken_after_a_row_of_their_pass_ended_move_up_to_the_rows_in_flight():
    cache = RowCache([CPU] * LAYERS, slots=3)
    prompts, keys = written(cache, [4, 4, 4], 0)
    cache.take(prompts[1], room=8)
    cache.take(prompts[2], room=8)
    assert cache.lengths == [4, 4] and [p.slot for p in prompts[1:]] == [0, 1]
    assert torch.equal(row_keys(cache, 0), keys[1]) and torch.equal(row_keys(cache, 1), keys[2])


def test_a_prompt_a_row_holds_is_copied_into_a_new_row_for_another_draw():
    cache = RowCache([CPU] * LAYERS)
    (prompt,), keys = written(cache, [5], 0)
    assert cache.take(prompt, room=8) == 0
    cache.prepare(2)
    cache.layers[0].update(torch.ones(1, HEADS, 2, DIM), torch.ones(1, HEADS, 2, DIM))
    cache.commit([2])
    assert cache.take(prompt, room=8) == 1
    assert prompt.slot == 0 and cache.lengths == [7, 5]
    assert torch.equal(row_keys(cache, 1), keys[0])


def test_a_prompt_outlives_its_first_row_in_the_rows_that_took_it_in():
    cache = RowCache([CPU] * LAYERS, slots=2)
    (prompt,), keys = written(cache, [5], 0)
    cache.take(prompt, room=8)
    cache.take(prompt, room=8)
    cache.drop([0])
    assert prompt.slot == 0 and cache.rows == 1
    assert cache.take(prompt, room=8) == 1
    assert torch.equal(row_keys(cache, 1), keys[0])


def test_a_prompt_follows_its_row_and_is_lost_to_a_later_pass():
    cache = RowCache([CPU] * LAYERS, slots=3)
    admitted(cache, 3, 0)
    admitted(cache, 4, 1)
    (prompt,), keys = written(cache, [5], 2)
    cache.take(prompt, room=8)
    cache.drop([0])
    assert prompt.slot == 0 and torch.equal(row_keys(cache, 0), keys[0])
    cache.drop([1])
    cache.drop([0])
    assert prompt.slot == 0 and cache.rows == 0
    assert cache.take(prompt, room=8) == 0
    assert torch.equal(row_keys(cache, 0), keys[0])
    cache.drop([0])
    written(cache, [2], 3)
    assert prompt.slot is None


def test_a_forward_writes_each_row_at_its_own_end():
    cache = RowCache([CPU] * LAYERS)
    admitted(cache, 5, 0)
    admitted(cache, 2, 1)
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
    admitted(cache, 6, 0)
    admitted(cache, 4, 1)
    before = [row_keys(cache, b).clone() for b in range(2)]
    cache.keep_rows([2, 1], torch.tensor([[0, 2, 3], [1, 0, 0]]), [3, 1])
    assert cache.lengths == [5, 2]
    assert torch.equal(row_keys(cache, 0), torch.cat([before[0][:, :2], before[0][:, [2, 4, 5]]], dim=1))
    assert torch.equal(row_keys(cache, 1), torch.cat([before[1][:, :1], before[1][:, [2]]], dim=1))


def test_keep_with_nothing_kept_cuts_a_row_back_to_its_start():
    cache = RowCache([CPU] * LAYERS)
    admitted(cache, 6, 0)
    admitted(cache, 4, 1)
    before = row_keys(cache, 0).clone()
    cache.keep_rows([3, 4], torch.tensor([[1], [0]]), [1, 0])
    assert cache.lengths == [4, 4]
    assert torch.equal(row_keys(cache, 0), torch.cat([before[:, :3], before[:, [4]]], dim=1))


def test_drop_frees_finished_rows_slots_for_the_last_rows():
    cache = RowCache([CPU] * LAYERS, slots=4)
    for seed, n in enumerate((3, 5, 2, 4)):
        admitted(cache, n, seed, room=4)
    before = [row_keys(cache, b).clone() for b in range(4)]
    order = cache.drop([0, 2])
    assert order == [3, 1]
    assert cache.rows == 2
    assert cache.lengths == [4, 5]
    assert all(torch.equal(row_keys(cache, b), before[old]) for b, old in enumerate(order))


def test_a_freed_slot_takes_the_next_sequence():
    cache = RowCache([CPU] * LAYERS, slots=2)
    admitted(cache, 3, 0, room=4)
    admitted(cache, 5, 1, room=4)
    kept = row_keys(cache, 1).clone()
    cache.drop([0])
    incoming = admitted(cache, 2, 2, room=4)
    assert cache.rows == 2 and cache.slots == 2
    assert torch.equal(row_keys(cache, 0), kept)
    assert torch.equal(row_keys(cache, 1), incoming)


def test_rows_grow_past_the_room_they_came_with():
    cache = RowCache([CPU] * LAYERS)
    admitted(cache, 3, 0, room=1)
    before = row_keys(cache, 0).clone()
    cache.prepare(10)
    assert cache.capacity >= 13
    assert torch.equal(row_keys(cache, 0), before)


def test_cache_keeps_one_slab_per_device_of_its_layers():
    cache = RowCache([CPU, torch.device("meta"), CPU])
    writer = cache.writer([4], room=0)
    for layer in writer.layers:
        layer.update(torch.zeros(1, 1, 4, 1), torch.zeros(1, 1, 4, 1))
    storage = [
        cache.slot_slab(layer, torch.zeros(1, 1, 4, 1), 0, 1)[0].untyped_storage().data_ptr() for layer in range(3)
    ]
    assert storage[0] == storage[2] != storage[1]


def test_a_fixed_cache_runs_forwards_over_a_bucket_of_slots_at_its_whole_capacity():
    cache = RowCache([CPU] * LAYERS, slots=3, fixed=True)
    for seed, n in enumerate((5, 2, 4)):
        admitted(cache, n, seed, room=4)
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
        admitted(cache, 3, seed, room=4)
    cache.drop([0, 1])
    cache.prepare(1)
    assert cache.bucket == 1
    cache.prepare(256)
    assert cache.capacity == fixed_capacity(3 + 256) == 512


def test_a_fixed_cache_keeps_its_buffers_for_the_next_batch():
    first = RowCache([CPU] * LAYERS, slots=2, fixed=True)
    admitted(first, 3, 0, room=4)
    second = RowCache([CPU] * LAYERS, slots=1, fixed=True, reuse=first)
    assert second.rows == 0 and second.slots == 2 and second.capacity == first.capacity
    admitted(second, 3, 1, room=4)
    assert second.layer_slab(0)[0].data_ptr() == first.layer_slab(0)[0].data_ptr()


def test_a_fixed_cache_that_keeps_a_smaller_batchs_buffers_grows_them_to_its_own_slots():
    first = RowCache([CPU] * LAYERS, slots=1, fixed=True)
    admitted(first, 3, 0, room=4)
    second = RowCache([CPU] * LAYERS, slots=4, fixed=True, reuse=first)
    for seed in range(4):
        admitted(second, 3, seed, room=4)
    second.prepare(1)
    keys, _ = second.layers[0].bound
    assert second.slots == 4 and keys.shape[0] == second.bucket == 4
    assert second.layer_slab(0)[0].shape[0] == 4
