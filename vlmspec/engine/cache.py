"""KV-cache bookkeeping: after verification keep exactly the accepted path, drop the rest, recompute nothing."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def check_cache(cache: DynamicCache) -> None:
    """Tree decoding rewrites cache entries in place; sliding-window and quantised layers cannot be rewritten so."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or isinstance(layer, DynamicSlidingWindowLayer):
            raise NotImplementedError(
                f"speculative decoding needs plain full-attention cache layers, got {type(layer).__name__}"
            )


def keep_entries(cache: DynamicCache, start: int, keep: torch.Tensor) -> int:
    """Of the entries from `start` on, keep those at offsets `keep` (ascending) and move them to `start`.

    Returns the new cache length. A keep set that is already a prefix (the common chain case) is a plain crop.
    Layers may sit on different devices (a target spread over GPUs); the indices follow each layer.
    """
    n = keep.shape[0]
    end = start + n
    is_prefix = n == 0 or int(keep[-1]) == n - 1
    src = {keep.device: keep + start}
    for layer in cache.layers:
        if not is_prefix:
            device = layer.keys.device
            if device not in src:
                src[device] = src[keep.device].to(device)
            layer.keys[:, :, start:end] = layer.keys[:, :, src[device]]
            layer.values[:, :, start:end] = layer.values[:, :, src[device]]
        layer.keys = layer.keys[:, :, :end]
        layer.values = layer.values[:, :, :end]
    return end
