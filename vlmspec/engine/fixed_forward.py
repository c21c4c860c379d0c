"""A decoding forward of fixed shapes, written as one function from the rows' tokens to the model's logits, so that
compiled it is one region: the tree mask over the cache's capacity, the padding to the rows' bucket and the padded
size, the position ids and the model's forward, with nothing left for the host to launch around it.

The rows, the tokens and the tree block's width vary from step to step, and the cache's capacity from prompt to
prompt; they are marked dynamic (`mark_varying`, and the cache's keys), so one graph serves every tree of a padded
size and bucket: only the padded inputs reach the model.
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
    slots: torch.Tensor,
    features: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`model`'s logits (bucket, q, V) for every row's `tokens` (B, q) at positions `start[b] + depths` (`start`
    (B,), `depths` (q,) or (B, q)), padded to the bucket of rows `starts` spans and the size `slots` (0, 1, ...,
    size - 1) spans, over a `cache` whose rows write from `starts` (bucket,) on and whose keys span its capacity
    (`cache.fixed_span()`, read off the keys' size, so that one graph serves every capacity). Row b's query i sees,
    of the row's last w keys after this forward, those `visible` (B, q, w + 2) marks (`with_edges`: column 0 every
    key before them, column w + 1 those after); padding (free slots, and queries past q) sees the first key only, so
    its outputs stay finite, and nothing sees it.
    `position_ids` makes the model's position ids of 1-D positions. A draft head reads each token's `features`
    (B, q, F), padded as the tokens are, and returns its pre-norm output (bucket, size, H) beside the logits (None
    for a model). Only the `q` real queries are projected to
    logits (`logits_to_keep`): the rows' logits are then a contiguous tensor's first rows, whatever the padded size.

    The padding is gathered (each padded row and query reads the last real one), never copied into a slice of the
    rows' or tokens' count: a copy into a slice ties that count to the padded size in the compiled graph, and each
    count would compile apart."""
    rows, q = tokens.shape
    width = visible.shape[-1] - 2
    bucket, size = starts.shape[0], slots.shape[0]
    device = tokens.device
    capacity = cache.fixed_span()
    row = torch.arange(bucket, device=device).clamp(max=rows - 1)
    query = slots.clamp(max=q - 1)
    real = (torch.arange(bucket, device=device) < rows)[:, None] & (slots < q)[None, :]
    padded_tokens = tokens[row][:, query]
    padded_positions = (start[:, None] + depths).expand(rows, q)[row][:, query]
    relative = torch.arange(capacity, device=device)[None, :] - starts[:, None]
    columns = (relative[row] - (q - width - 1)).clamp(0, width + 1)
    seen = visible[row].gather(2, columns[:, None, :].expand(-1, q, -1))[:, query]
    first = torch.arange(capacity, device=device) == 0
    padded_seen = torch.where(real[..., None], seen, first)
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.where(padded_seen, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]
    ids = position_ids(padded_positions.reshape(-1))
    ids = ids.reshape(*ids.shape[:-2], bucket, size)
    inputs = dict(input_ids=padded_tokens, position_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    if features is not None:
        inputs["features"] = features[row][:, query]
    out = model(**inputs, logits_to_keep=torch.arange(q, device=device))
    return out.logits, out.hidden_states if features is not None else None


class FixedForward(torch.nn.Module):
    """`fixed_forward` of one model, as the module `torch.compile` compiles (so that each model holds its own compiled
    form, and a failing one is known by its `model`)."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, *args: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        return fixed_forward(self.model, *args)


def mark_varying(
    tokens: torch.Tensor,
    start: torch.Tensor,
    depths: torch.Tensor,
    visible: torch.Tensor,
    starts: torch.Tensor,
    slots: torch.Tensor,
    features: torch.Tensor | None = None,
) -> None:
    """Mark the sizes that vary from forward to forward dynamic for the compiler (rows and their bucket, tokens and
    their padded size, and the tree block's width, where at least 2: a size of 1 is compiled apart), so that they
    share a graph: a model compiles a handful of graphs, not one per bucket and padded size (a CUDA graph is still
    captured per shape)."""
    rows, q = tokens.shape
    marks = [(tokens, 0, rows), (start, 0, rows), (visible, 0, rows), (tokens, 1, q), (visible, 1, q)]
    marks += [(depths, depths.ndim - 1, q)] + ([(depths, 0, rows)] if depths.ndim == 2 else [])
    marks += [(starts, 0, starts.shape[0]), (slots, 0, slots.shape[0])]
    if features is not None:
        marks += [(features, 0, rows), (features, 1, q)]
    for tensor, dim, size in marks:
        if size > 1:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    torch._dynamo.maybe_mark_dynamic(visible, 2)
