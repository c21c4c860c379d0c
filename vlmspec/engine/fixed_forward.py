"""A decoding forward of fixed shapes, written as one function from the rows' tokens to the model's logits, so that
compiled it is one region: the tree mask over the cache's capacity, the padding to the rows' bucket and the padded
size, the position ids and the model's forward, with nothing left for the host to launch around it.

The rows, the tokens and the tree block's width vary from step to step; they are marked dynamic (`mark_varying`),
so one graph serves every tree of a padded size, bucket and cache capacity: only the padded inputs reach the model,
whose shapes are fixed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache


def fixed_forward(
    model: PreTrainedModel,
    position_ids: Callable[[torch.Tensor], torch.Tensor],
    cache: Cache,
    tokens: torch.Tensor,
    start: torch.Tensor,
    depths: torch.Tensor,
    visible: torch.Tensor,
    starts: torch.Tensor,
    shape: tuple[int, int, int],
) -> torch.Tensor:
    """`model`'s logits (bucket, size, V) for every row's `tokens` (B, q) at positions `start[b] + depths` (`start`
    (B,), `depths` (q,) or (B, q)), padded to `shape`'s
    bucket of rows and size, over a `cache` of `shape`'s capacity whose rows write from `starts` (bucket,) on. Row b's
    query i sees, of the row's last w keys after this forward, those `visible` (B, q, w + 2) marks (`with_edges`:
    column 0 every key before them, column w + 1 those after); padding (free slots, and queries past q) sees the first
    key only, so its outputs stay finite, and nothing sees it. `position_ids` makes the model's position ids of 1-D
    positions."""
    rows, q = tokens.shape
    width = visible.shape[-1] - 2
    bucket, size, capacity = shape
    device = tokens.device
    positions = (start[:, None] + depths).expand(rows, q)
    relative = torch.arange(capacity, device=device)[None, :] - starts[:rows, None]
    columns = (relative - (q - width - 1)).clamp(0, width + 1)
    seen = visible.gather(2, columns[:, None, :].expand(-1, q, -1))
    padded_tokens = tokens.new_zeros(bucket, size)
    padded_tokens[:rows, :q] = tokens
    padded_positions = positions.new_zeros(bucket, size)
    padded_positions[:rows, :q] = positions
    padded_positions[:rows, q:] = positions[:, -1:]
    padded_seen = seen.new_zeros(bucket, size, capacity)
    padded_seen[..., 0] = True
    padded_seen[:rows, :q] = seen
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.where(padded_seen, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]
    ids = position_ids(padded_positions.reshape(-1))
    ids = ids.reshape(*ids.shape[:-2], bucket, size)
    return model(input_ids=padded_tokens, position_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits


class FixedForward(torch.nn.Module):
    """`fixed_forward` of one model, as the module `torch.compile` compiles (so that each model holds its own compiled
    form, and a failing one is known by its `model`)."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, *args: object) -> torch.Tensor:
        return fixed_forward(self.model, *args)


def mark_varying(tokens: torch.Tensor, start: torch.Tensor, depths: torch.Tensor, visible: torch.Tensor) -> None:
    """Mark the sizes that vary from forward to forward dynamic for the compiler (rows, tokens and the tree block's
    width, where at least 2: a size of 1 is compiled apart), so that they share a graph."""
    rows, q = tokens.shape
    marks = [(tokens, 0, rows), (start, 0, rows), (visible, 0, rows), (tokens, 1, q), (visible, 1, q)]
    marks += [(depths, depths.ndim - 1, q)] + ([(depths, 0, rows)] if depths.ndim == 2 else [])
    for tensor, dim, size in marks:
        if size > 1:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    torch._dynamo.maybe_mark_dynamic(visible, 2)
