"""The tree attention: the cached prefix unmasked on the fused kernel, the tree block masked, merged by log-sum-exp."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from vlmspec.adapters import adapter_for
from vlmspec.attention import (
    TREE_IMPLEMENTATIONS,
    fold_heads,
    grouped_attention,
    tree_attention,
    tree_block_attention,
    unfold_heads,
)
from vlmspec.engine.model_runner import ModelRunner
from vlmspec.engine.tree import additive_mask, with_edges


def made_up(heads: int, kv_heads: int, q: int, length: int, dtype=torch.float32):
    generator = torch.Generator().manual_seed(heads * 100 + length)
    shape = (2, heads, q, 16), (2, kv_heads, length, 16)
    query = torch.randn(*shape[0], generator=generator).to(DEVICE, dtype)
    key, value = (torch.randn(*shape[1], generator=generator).to(DEVICE, dtype) for _ in range(2))
    visible = torch.rand(q, q, generator=generator).lt(0.5).tril_(-1) | torch.eye(q, dtype=torch.bool)
    return query, key, value, visible.to(DEVICE)


def reference(query, key, value, visible, scale):
    """SDPA with a dense full-width mask and key/value heads repeated per query head."""
    groups = query.shape[1] // key.shape[1]
    mask = additive_mask(visible, torch.float32, prefix_len=key.shape[2] - visible.shape[1])
    key, value = (t.float().repeat_interleave(groups, dim=1) for t in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(query.float(), key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("length", [9, 300])
def test_tree_block_attention_equals_sdpa_with_a_full_width_mask(heads, kv_heads, length):
    query, key, value, visible = made_up(heads, kv_heads, q=9, length=length)
    out = tree_block_attention(query, key, value, additive_mask(visible, torch.float32), scale=0.25)
    torch.testing.assert_close(out, reference(query, key, value, visible, 0.25), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_grouped_attention_over_a_full_width_mask_equals_sdpa_with_repeated_keys(heads, kv_heads):
    query, key, value, visible = made_up(heads, kv_heads, q=9, length=300)
    full = additive_mask(visible, torch.float32, prefix_len=291)
    out = grouped_attention(query, key, value, full, scale=0.25)
    torch.testing.assert_close(out, reference(query, key, value, visible, 0.25), rtol=1e-5, atol=1e-5)


def test_tree_block_attention_keeps_the_models_dtype_and_agrees_in_bfloat16():
    query, key, value, visible = made_up(4, 2, q=5, length=64, dtype=torch.bfloat16)
    out = tree_block_attention(query, key, value, additive_mask(visible, torch.bfloat16), scale=0.25)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(query, key, value, visible, 0.25), rtol=2e-2, atol=2e-2)


def test_a_tree_forward_equals_the_models_own_attention_with_a_full_width_mask(qwen):
    """A batch of one attends through the tree block (the prefix unmasked on the fused kernel), a batch of two through
    a mask over every key; both give the logits of the model's own attention under a full-width mask."""
    adapter = adapter_for(qwen.target)
    with torch.no_grad():
        cache = adapter.new_cache()
        result = adapter.prefill(qwen.cases["image"], cache)
        start, offset, device = result.length, result.next_position - result.length, adapter.device
        tokens = torch.tensor([5, 6, 7, 8], device=device)
        depths = torch.tensor([1, 2, 2, 3], device=device)
        visible = torch.tensor(
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool, device=device
        )
        trees = []
        for rows in (1, 2):
            runner = ModelRunner(adapter)
            _, prompt = runner.prefill(qwen.cases["image"], room=4)
            for _ in range(rows):
                runner.take(prompt, room=4)
            positions = torch.tensor(runner.positions(runner.lengths), device=device)
            trees.append(runner.forward_rows(tokens.expand(rows, -1), depths, positions, with_edges(visible))[0])
        full = additive_mask(visible, adapter.dtype, prefix_len=start)
        own = adapter.decode(tokens, depths + start + offset, full, cache)
    for tree in trees:
        torch.testing.assert_close(tree, own.to(tree.device), rtol=1e-4, atol=1e-4)


def test_tree_attention_is_in_force_only_inside_its_context(qwen):
    config = adapter_for(qwen.target).language_model.config
    before = config._attn_implementation
    with tree_attention(config):
        assert config._attn_implementation == TREE_IMPLEMENTATIONS[before]
        with tree_attention(config):
            assert config._attn_implementation == TREE_IMPLEMENTATIONS[before]
        assert config._attn_implementation == TREE_IMPLEMENTATIONS[before]
    assert config._attn_implementation == before


def test_tree_attention_is_restored_when_a_forward_fails(qwen):
    config = adapter_for(qwen.target).language_model.config
    before = config._attn_implementation
    with pytest.raises(RuntimeError), tree_attention(config):
        raise RuntimeError("forward failed")
    assert config._attn_implementation == before


def test_overlapping_tree_attention_blocks_restore_the_models_own_when_the_last_ends(qwen):
    config = adapter_for(qwen.target).language_model.config
    before = config._attn_implementation
    first, second = tree_attention(config), tree_attention(config)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert config._attn_implementation == TREE_IMPLEMENTATIONS[before]
    second.__exit__(None, None, None)
    assert config._attn_implementation == before


@pytest.mark.parametrize("layout", ["contiguous", "length outside heads"])
def test_unfolding_heads_undoes_folding_in_the_layout_attention_returns(layout):
    query = torch.randn(2, 8, 3, 16, device=DEVICE)
    folded = fold_heads(query, 2)
    if layout != "contiguous":
        # CUDA's fused kernels return (B, heads, L, D) with the length outside the heads in memory.
        folded = folded.transpose(1, 2).contiguous().transpose(1, 2)
    out = unfold_heads(folded, query)
    assert out.is_contiguous() and torch.equal(out, query.transpose(1, 2))
