"""One model decoding B sequences together: every row feeds its own tokens, one forward runs them all."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..adapters import ModelAdapter
from ..attention import tree_attention
from .cache import TREE_ROOM, SlabCache
from .counting import arange, host_values
from .row_cache import RowCache
from .runner import ModelRunner


@dataclass
class RowForward:
    """What one sequence feeds a forward: `tokens` (q,) at `depths` (q,) past the cache index `base_index`, each
    seeing every key of the sequence before its last k and, of those k (its own and earlier levels'), the ones
    `visible` (q, k) marks. A tree's growth yields one per draft forward it needs (`Drafter.steps`), and a batch
    carries one per row."""

    tokens: torch.Tensor
    depths: torch.Tensor
    visible: torch.Tensor
    base_index: int


class RowRunner:
    """A model over a `RowCache`: rows come in prefilled (from a batch-1 `ModelRunner`), feed padded forwards together
    and leave when finished. The token at row b's cache index i sits at position `i + offsets[b]`."""

    def __init__(self, adapter: ModelAdapter, slots: int = 1):
        self.adapter = adapter
        self.cache = RowCache(adapter.layer_devices(), slots)
        self.offsets: list[int] = []
        self._offsets: tuple[list[int], torch.Tensor] | None = None
        self.refresh()

    def refresh(self) -> None:
        self.device = self.adapter.device
        self.dtype = self.adapter.dtype
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)

    @property
    def lengths(self) -> list[int]:
        return self.cache.lengths

    def append(self, prefilled: ModelRunner, room: int) -> int:
        """Take in the sequence `prefilled` holds (its cache and positions), with `room` more tokens (and a tree's) to
        come; returns its row."""
        self.offsets.append(prefilled.offset)
        return self.cache.append(prefilled.cache, room + TREE_ROOM)

    def append_row(self, cache: SlabCache, room: int, row: int, start: int, offset: int) -> int:
        """Take in row `row` of a batched prefill's `cache` (its prompt from `start` on, its positions `offset` past
        its cache indices), with `room` more tokens (and a tree's) to come; returns its row here."""
        self.offsets.append(offset)
        return self.cache.append(cache, room + TREE_ROOM, row, start)

    def discard(self, rows: int) -> None:
        """Forget every row from index `rows` on (what a failed admission may have left)."""
        if self.cache.rows > rows:
            self.drop(list(range(rows, self.cache.rows)))

    def drop(self, rows: list[int]) -> list[int]:
        """Remove finished rows (a freed slot takes the last row); returns the new order as old row indices."""
        order = self.cache.drop(rows)
        self.offsets = [self.offsets[b] for b in order]
        return order

    def forward(self, requests: list[RowForward | None]) -> torch.Tensor:
        """Run every row's request in one forward (rows with None feed padding that is never kept); returns the
        logits `(B, q, V)`, row b's first `q_b` its own (the rest padding). Each row's fed tokens enter its cache."""
        cache, device = self.cache, self.device
        counts = [0 if r is None else r.tokens.shape[0] for r in requests]
        q = max(counts)
        cache.prepare(q)
        rows = len(requests)
        tokens = torch.zeros(rows, q, dtype=torch.long, device=device)
        positions = torch.zeros(rows, q, dtype=torch.long, device=device)
        visible = torch.zeros(rows, q, cache.span, dtype=torch.bool, device=device)
        for b, request in enumerate(requests):
            length = cache.lengths[b]
            if request is None:
                visible[b, :, :length] = True
                continue
            n, width = counts[b], request.visible.shape[1]
            tokens[b, :n] = request.tokens
            positions[b, :n] = request.depths + (request.base_index + self.offsets[b])
            block = length + n - width
            visible[b, :, :block] = True
            visible[b, :n, block : length + n] = request.visible
        return self._run(tokens, positions, visible, counts)

    def forward_rows(
        self,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        start: torch.Tensor,
        visible: torch.Tensor | None,
        counts: list[int] | None = None,
    ) -> torch.Tensor:
        """Every row feeds `tokens` (B, q) at positions `start[b] + depths` (`depths` (q,) or (B, q)); row b's first
        `counts[b]` (all, by default) enter its cache. With `visible` (q, w), as `with_edges` gives it (q, w + 2),
        every row's query i sees, of the row's last w keys after this forward (its own and earlier tree levels'), the
        marked ones, and every key before them; with (B, q, w + 2) each row marks its own (trees of different
        shapes); with None, the row's keys up to its own (a causal block). Returns the logits (B, q, V). A fixed
        number of operations, whatever the rows."""
        cache, device = self.cache, self.device
        rows, q = tokens.shape
        cache.prepare(q)
        relative = arange(cache.span, device)[None, :] - cache.starts[:, None]
        if visible is None:
            seen = relative[:, None, :] <= arange(q, device)[None, :, None]
        else:
            width = visible.shape[-1] - 2
            columns = (relative - (q - width)).clamp(-1, width)
            if visible.ndim == 2:
                seen = visible[:, columns].transpose(0, 1)
            else:  # the last column (index -1) is the one for the keys before the block
                seen = visible.gather(2, (columns % (width + 2))[:, None, :].expand(-1, q, -1))
        return self._run(tokens, start[:, None] + depths, seen, [q] * rows if counts is None else counts)

    def positions(self, index: torch.Tensor) -> torch.Tensor:
        """The positions (B,) of each row's token at cache index `index[b]`."""
        return self.offsets_tensor() + index

    def offsets_tensor(self) -> torch.Tensor:
        """The rows' position offsets on the device (made again only when the rows change)."""
        if self._offsets is None or self._offsets[0] != self.offsets:
            self._offsets = (list(self.offsets), host_values(self.offsets, self.device))
        return self._offsets[1]

    def _run(
        self, tokens: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor, counts: list[int]
    ) -> torch.Tensor:
        """The forward over `tokens` (B, q) at `positions`, each query seeing the keys `seen` (B, q, span) marks; the
        first `counts[b]` of row b enter its cache. Returns the logits (B, q, V)."""
        rows, q = tokens.shape
        mask = torch.where(seen, self._zero, torch.finfo(self.dtype).min)
        position_ids = self.adapter.position_ids(positions.reshape(-1))
        position_ids = position_ids.reshape(*position_ids.shape[:-2], rows, q)
        with tree_attention(self.adapter.language_model.config):
            out = self.adapter.model(
                input_ids=tokens,
                position_ids=position_ids,
                attention_mask=mask[:, None],
                past_key_values=self.cache,
                use_cache=True,
            )
        self.cache.commit(counts)
        return out.logits.to(self.device)

    def keep_rows(self, starts: list[int], offsets: torch.Tensor, counts: list[int]) -> None:
        """In each row b, of the entries from `starts[b]` on keep those at its first `counts[b]` `offsets` (B, W)."""
        self.cache.keep_rows(starts, offsets.to(self.device), counts)
