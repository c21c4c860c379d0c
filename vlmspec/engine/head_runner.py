"""The runner of a draft head: its forwards read a feature beside every token, and its cache keeps, besides its keys,
the pre-norm outputs of the step's tree, slot by slot, which the tree's next level reads at each node's parent.

A head's cache entry j holds the token after position j beside the target's feature at position j (the head's
prompt is one entry shorter than the target's). A step's first forward feeds the tokens the head has not seen with the
target's features (the verification's, at the accepted path); each tree level then feeds its nodes beside their
parents' outputs (EAGLE-3 feeds back the head's own pre-norm output). The commit keeps none of the tree's entries:
the accepted tokens are fed again next step with the target's features.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from ..device_tensors import arange, host_values
from .kv_cache import TREE_ROOM, PromptSlot
from .model_runner import ModelRunner
from .prefix import CachedPrefix


def parent_slots(visible: torch.Tensor, q: int) -> torch.Tensor:
    """Each of a level's `q` nodes' parent slot, (q,) or (B, q), from the level's visibility `visible` ((q, w + 2)
    or (B, q, w + 2), `with_edges` over the tree's slots 1..w, the level's nodes the last q): the deepest ancestor
    before the node itself, or slot 0 (the root, the key before the block) for the first level."""
    width = visible.shape[-1] - 2
    columns = arange(width + 2, visible.device)
    own = (width - q + 1) + arange(q, visible.device)
    before = (columns[None, :] < own[:, None]) & (columns[None, :] >= 1)
    return ((visible & before).to(torch.int32) * columns.to(torch.int32)).amax(-1).long()


class HeadRunner(ModelRunner):
    """`ModelRunner` of a draft head (see the module's docstring). Its forwards take `features`: given, they are the
    target's, beside the tokens the head has not seen (a step's first forward; the last of each row's `counts` is its
    root); absent, a tree level's nodes read their parents' outputs (a causal block without them, as the compile
    check and warm-up feed, reads zeros)."""

    def __init__(self, adapter, compiled=None, guard=None, role: str = "draft"):
        super().__init__(adapter, compiled, guard, role)
        self.width = adapter.model.head_config.hidden_size
        self._tree: torch.Tensor | None = None

    @property
    def keeps_tree(self) -> bool:
        return False

    def entries(self, tokens: int) -> int:
        return tokens - 1

    def continue_draft(
        self,
        inputs: dict[str, Any],
        own: CachedPrefix | None,
        room: int,
        target: CachedPrefix,
        features: torch.Tensor | None,
    ) -> PromptSlot:
        """A head's prompt going on from a cache: its own prefix where the cache held one (none otherwise: it has no
        features of the cached tokens), then the tokens the target ran after `target` (its prefix), each after the
        first beside the target's feature (`features` (q, 3H)) of the token before it, at that token's position. The
        last feature goes beside the first new token, as after a prompt. Entries the head missed between its own
        prefix and the target's (the last call's pending tokens) are not fed."""
        self.refresh()
        ids = inputs["input_ids"][:, target.covers :]
        cache = DynamicCache(config=self.adapter.model.config)
        for index, (keys, values) in enumerate([] if own is None else own.layers):
            cache.update(keys, values, index)
        self.adapter.continue_entries(ids[:, 1:], features[None, :-1], cache, target.next_position)
        length = cache.get_seq_length()
        writer = self.cache.writer([length], room + TREE_ROOM)
        if length:  # the head's one layer
            writer.write(0, cache.layers[0].keys, cache.layers[0].values)
        (prompt,) = writer.prompts([target.next_position + ids.shape[1] - 1 - length])
        return prompt

    def forward_rows(
        self,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        start: torch.Tensor,
        visible: torch.Tensor | None,
        counts: list[int] | None = None,
        eager: bool = False,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows, q = tokens.shape
        if features is None and visible is not None:
            return self._level(tokens, depths, start, visible, eager)
        if features is None:
            features = torch.zeros(rows, q, self.width, dtype=self.dtype, device=self.device)
        logits, hidden = self._forward(tokens, depths, start, visible, counts, eager, features)
        last = host_values([q - 1] * rows if counts is None else [c - 1 for c in counts], self.device)
        tree = torch.empty(rows, TREE_ROOM, self.width, dtype=hidden.dtype, device=self.device)
        tree[:, 0] = hidden.gather(1, last[:, None, None].expand(rows, 1, self.width))[:, 0]
        self._tree = tree
        return logits

    def _level(
        self, tokens: torch.Tensor, depths: torch.Tensor, start: torch.Tensor, visible: torch.Tensor, eager: bool
    ) -> torch.Tensor:
        """A tree level: each node beside its parent's output (`parent_slots`), its own output kept at its slot."""
        rows, q = tokens.shape
        width = visible.shape[-1] - 2
        parents = parent_slots(visible, q)
        parents = parents.expand(rows, q) if parents.ndim == 1 else parents
        tree = self._tree
        if tree.shape[1] <= width:  # a tree wider than the room kept for one: grown once, for this step
            tree = self._tree = torch.cat([tree, torch.empty_like(tree)[:, : width + 1]], dim=1)
        features = tree.gather(1, parents[..., None].expand(rows, q, self.width))
        logits, hidden = self._forward(tokens, depths, start, visible, None, eager, features)
        tree[:, width - q + 1 : width + 1] = hidden
        return logits
