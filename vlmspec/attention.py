"""Attention for trees, registered with transformers' attention interface for every family.

A tree forward's queries see the whole cached prefix and, of the block of keys they bring, only their ancestors.
So the mask the engine passes covers only that block, `(1, 1, q, k)` additive over the last k keys, and the
prefix needs none: it runs unmasked on the backend's fused kernel (which also returns its log-sum-exp), the block
runs as a small masked product, and the two merge by log-sum-exp. Grouped-query heads are folded into the query
length (the `g` query heads of one key/value head become `g x q` rows over that head), so no key or value is
copied per query head. Fixed-shape forwards (compiled ones) attend over the cache's whole capacity through a mask
as wide, with the same folding (`grouped_attention`). Prompts (as many queries as keys) go to the model's own
implementation unchanged, which also hands their queries and keys to an `observing` callback (the verifier's scores
for pruning come from here).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import eager_mask, sdpa_mask

#: Attention implementations trees can run on, and the name each is registered under with its tree path.
TREE_IMPLEMENTATIONS = {"sdpa": "vlmspec_tree_sdpa", "eager": "vlmspec_tree_eager"}

#: Called as `observer(module, query, key)` by every prompt forward's attention while set.
_observer: ContextVar[Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], None] | None] = ContextVar(
    "vlmspec_attention_observer", default=None
)


@contextmanager
def observing(observer: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], None]) -> Iterator[None]:
    """While active, forwards under the tree attention that carry no tree block (prompts) hand each layer's rotated
    queries `(B, heads, L, D)` and keys `(B, kv heads, L, D)` to `observer`."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


def fold_heads(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """`query` `(B, heads, q, D)` as `(B, kv heads, heads / kv heads x q, D)`: the query heads that share a key/value
    head (in transformers' `repeat_kv` order) become rows over it, so attending copies no key or value per head."""
    batch, heads, q, dim = query.shape
    return query.reshape(batch, kv_heads, heads // kv_heads * q, dim)


def unfold_heads(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """A folded attention output `(B, kv heads, heads / kv heads x q, D)` in the layout attention functions return,
    `(B, q, heads, D)`, in `query`'s dtype. CUDA's attention kernels return it strided (the length outside the heads),
    where no view merges the heads, so this splits the folded length and copies once, into the final layout."""
    batch, heads, q, dim = query.shape
    kv_heads = out.shape[1]
    grouped = out.to(query.dtype).view(batch, kv_heads, heads // kv_heads, q, dim)
    return grouped.permute(0, 3, 1, 2, 4).reshape(batch, q, heads, dim).contiguous()


def _eager_forward(module: torch.nn.Module) -> Callable:
    """The eager attention function of the module's own modeling file (each family defines its own)."""
    return sys.modules[type(module).__module__].eager_attention_forward


@functools.cache
def _cuda_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """The fused kernel that returns a log-sum-exp for these inputs on this GPU: flash (half precision, Ampere or
    newer, head sizes up to 256 in steps of 8), memory-efficient (half or float32; bfloat16 needs Ampere), or None."""
    ampere = torch.cuda.get_device_capability(device) >= (8, 0)
    half = dtype in (torch.float16, torch.bfloat16)
    if half and ampere and head_dim % 8 == 0 and head_dim <= 256 and torch.backends.cuda.flash_sdp_enabled():
        return "flash"
    if (dtype != torch.bfloat16 or ampere) and torch.backends.cuda.mem_efficient_sdp_enabled():
        return "efficient"
    return None


def _fused_with_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention `(B, H, q, D)` and its log-sum-exp `(B, H, q)` in float32, on the device's fused kernel."""
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, scale=scale)
        return out, lse
    kernel = _cuda_kernel(query.device, query.dtype, query.shape[-1]) if query.device.type == "cuda" else None
    if kernel == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, scale=scale)[:2]
    if kernel == "efficient":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, True, scale=scale)[
            :2
        ]
        return out, lse[..., : query.shape[2]]
    scores = (query @ key.transpose(-1, -2)).float() * scale
    lse = scores.logsumexp(-1)
    return ((scores - lse[..., None]).exp() @ value.float()).to(query.dtype), lse


def tree_block_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention `(B, q, heads, D)` of `query (B, heads, q, D)` over `key`/`value (B, kv heads, L, D)`: every query
    sees the first `L - k` keys, and of the last k those `block` `(1|B, 1, q, k)` (additive) lets through."""
    batch, heads, q, _ = query.shape
    kv_heads, length, width = key.shape[1], key.shape[2], block.shape[-1]
    groups = heads // kv_heads
    folded = fold_heads(query, kv_heads)
    tree_keys, tree_values = key[:, :, length - width :], value[:, :, length - width :]
    scores = (folded @ tree_keys.transpose(-1, -2)).float().mul_(scale).view(batch, kv_heads, groups, q, width)
    scores = scores.add_(block.float()[:, :, None]).view(batch, kv_heads, groups * q, width)
    lse = scores.logsumexp(-1)
    if width < length:
        prefix, prefix_lse = _fused_with_lse(folded, key[:, :, : length - width], value[:, :, : length - width], scale)
        total = torch.logaddexp(prefix_lse, lse)
        out = (scores - total[..., None]).exp_() @ tree_values.float()
        out = out.addcmul_(prefix.float(), (prefix_lse - total).exp_()[..., None])
    else:
        out = (scores - lse[..., None]).exp_() @ tree_values.float()
    return unfold_heads(out, query)


def grouped_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention `(B, q, heads, D)` through an additive `mask` `(1|B, 1, q, L)` over all L keys, with the query heads
    of each key/value head folded into the query length: the mask is repeated per head group, the keys and values
    are not (for the fixed-shape forwards, whose mask spans the cache's capacity)."""
    heads, q = query.shape[1], query.shape[2]
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    tiled = mask[:, :, None].expand(mask.shape[0], 1, groups, q, length).reshape(mask.shape[0], 1, groups * q, length)
    out = torch.nn.functional.scaled_dot_product_attention(
        fold_heads(query, kv_heads), key, value, attn_mask=tiled, scale=scale
    )
    return unfold_heads(out, query)


def _tree_attention(base: str) -> Callable:
    """The attention function registered for models loaded with `base` (`"sdpa"` or `"eager"`)."""

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is not None and query.shape[2] < key.shape[2]:
            scale = query.shape[-1] ** -0.5 if scaling is None else scaling
            if attention_mask.shape[-1] < key.shape[2]:
                return tree_block_attention(query, key, value, attention_mask, scale), None
            return grouped_attention(query, key, value, attention_mask, scale), None
        observer = _observer.get()
        if observer is not None:
            observer(module, query, key)
        own = sdpa_attention_forward if base == "sdpa" else _eager_forward(module)
        return own(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    return attention


for _base, _name in TREE_IMPLEMENTATIONS.items():
    AttentionInterface.register(_name, _tree_attention(_base))
    AttentionMaskInterface.register(_name, sdpa_mask if _base == "sdpa" else eager_mask)


_switch_lock = threading.Lock()
#: Per switched config (by id): how many `tree_attention` blocks hold it, and the implementation to restore.
_switched: dict[int, list] = {}


@contextmanager
def tree_attention(config) -> Iterator[None]:
    """While active, the decoder reading `config` (a text config) attends through the tree attention. Blocks may
    nest and overlap across threads: the model's own implementation comes back when the last one ends."""
    with _switch_lock:
        held = _switched.get(id(config))
        if held is None and (config._attn_implementation or "eager") in TREE_IMPLEMENTATIONS:
            held = _switched[id(config)] = [0, config._attn_implementation]
            config._attn_implementation = TREE_IMPLEMENTATIONS[held[1] or "eager"]
        if held is not None:
            held[0] += 1
    try:
        yield
    finally:
        if held is not None:
            with _switch_lock:
                held[0] -= 1
                if held[0] == 0:
                    del _switched[id(config)]
                    config._attn_implementation = held[1]
