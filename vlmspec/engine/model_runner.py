"""One model's runner: its prompt passes write new rows into its cache, and its decoding forwards run every row
together (each feeding its own tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from ..adapters import ModelAdapter
from ..attention import tree_attention
from ..device_tensors import arange, host_values
from .compiled import CHECK_TOKENS, CompileGuard, GuardedRunner, padded_size, padded_sizes
from .features import FeatureTap
from .fixed_forward import fixed_forward, mark_varying
from .kv_cache import TREE_ROOM, PromptSlot, RowCache, check_cache
from .prefix import CachedPrefix


class ModelRunner(GuardedRunner):
    """A model over one `RowCache`: a prompt pass (`prefill`, or `prefill_rows` for a left-padded batch) writes new
    rows' keys into free slots, `take` makes them rows, the rows feed padded forwards together and leave when
    finished. The token at row b's cache index i sits at position `i + offsets[b]` (M-RoPE prompts end beyond their
    length, pruned ones short).

    With `compiled` (the model under `torch.compile`) every decoding forward runs fixed-shape through it: the rows
    padded to their bucket (`row_bucket`), the tokens to a padded size, the mask over the cache's rounded capacity;
    prompt passes run eager. `guard` (the pair's) decides what a compiled forward that fails does: raise, or turn the
    pair eager and run it again eager. With a `tap` (a target paired with a draft head) its forwards keep the features
    the head reads: `verify` returns them beside the logits, and a prompt pass's prompts carry them. `row_depths`
    says which depths the fixed forwards take: every row's own (the target's trees) or one for all rows (the draft's
    levels). Each batch (`start`) takes the last batch's fixed
    buffers, so compiled graphs keep their addresses.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        compiled: Callable | None = None,
        guard: CompileGuard | None = None,
        role: str = "model",
        row_depths: bool = False,
        tap: FeatureTap | None = None,
    ):
        super().__init__(adapter, compiled, guard, role)
        self.row_depths = row_depths
        self.tap = tap
        check_cache(adapter.model.config)
        self.cache = RowCache(adapter.layer_devices(), fixed=compiled is not None)
        self.offsets: list[int] = []
        self.refresh()

    def refresh(self) -> None:
        super().refresh()
        self._zero = torch.zeros((), dtype=self.dtype, device=self.device)

    @property
    def lengths(self) -> list[int]:
        return self.cache.lengths

    def start(self, slots: int) -> None:
        """Begin a batch of up to `slots` rows on an empty cache, fixed while the model runs compiled (keeping the
        last fixed cache's buffers); the last batch's rows are gone."""
        self.refresh()
        fixed = self.compiled is not None
        self.cache = RowCache(self.adapter.layer_devices(), slots, fixed=fixed, reuse=self.cache)
        self.offsets = []

    def release(self) -> None:
        """Let go of the rows and their keys (a fixed cache's buffers stay for the next batch's graphs)."""
        self.start(1)

    def prefill(
        self, inputs: dict[str, Any], room: int, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, PromptSlot]:
        """Run one prompt (only its `keep` tokens, if given) into the next free slot, with room for `room` more tokens
        (and a tree's); returns the last prompt token's logits and the prompt as written, for `take`."""
        self.refresh()
        length = self.entries(inputs["input_ids"].shape[1] if keep is None else int(keep.sum()))
        writer = self.cache.writer([length], room + TREE_ROOM)
        with tree_attention(self.adapter.language_model.config):
            result = self.adapter.prefill(inputs, writer, keep)
        (prompt,) = writer.prompts([result.next_position - result.length])
        prompt.features = None if self.tap is None else self.tap.take()[0]
        return result.last_logits.to(self.device), prompt

    def prefill_rows(
        self, inputs: dict[str, Any], lengths: list[int], room: int, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[PromptSlot]]:
        """Run a left-padded batch of prompts, row b's `lengths[b]` tokens long, into as many free slots, with room
        for `room` more tokens (and a tree's) each; returns each row's last-token logits `(B, V)` and the prompts as
        written, for `take`. With `keep` (B, L) bool only the kept tokens run, left-padded again to the most any row
        keeps (`lengths` then counts them)."""
        self.refresh()
        lengths = [self.entries(length) for length in lengths]
        writer = self.cache.writer(lengths, room + TREE_ROOM)
        with tree_attention(self.adapter.language_model.config):
            logits, positions = self.adapter.prefill_rows(inputs, writer, keep)
        offsets = [position - length for position, length in zip(positions, lengths, strict=True)]
        prompts = writer.prompts(offsets)
        if self.tap is not None:
            features = self.tap.take()
            for b, prompt in enumerate(prompts):
                prompt.features = features[b, features.shape[1] - lengths[b] :]
        return logits.to(self.device), prompts

    def prefill_continued(
        self, input_ids: torch.Tensor, prefix: CachedPrefix, room: int
    ) -> tuple[torch.Tensor, PromptSlot]:
        """Run `input_ids` (1, q) after what `prefix` holds (a conversation's next turn after its cached turns), as
        `generate` runs the uncached part of its inputs, into the next free slot, with room for `room` more tokens
        (and a tree's); returns the last token's logits and the prompt as written (the prefix's keys, then these),
        for `take`. `prefix` is left as it was."""
        self.refresh()
        cache = DynamicCache(config=self.adapter.model.config)
        for index, (keys, values) in enumerate(prefix.layers):
            cache.update(keys, values, index)
        logits = self.adapter.continue_prompt(input_ids, cache, prefix.next_position)
        writer = self.cache.writer([prefix.length + input_ids.shape[1]], room + TREE_ROOM)
        for index, layer in enumerate(cache.layers):
            writer.write(index, layer.keys, layer.values)
        (prompt,) = writer.prompts([prefix.next_position - prefix.length])
        prompt.features = None if self.tap is None else self.tap.take()[0]
        return logits.to(self.device), prompt

    def continue_draft(
        self,
        inputs: dict[str, Any],
        own: CachedPrefix | None,
        room: int,
        target: CachedPrefix,
        features: torch.Tensor | None,
    ) -> PromptSlot:
        """A drafter's prompt for a sequence going on from a cache, for `take`: after its own prefix `own` where the
        cache held one, else over all of `inputs` again. (`target`, the target's prefix, and `features`, the
        target's of the tokens it ran after that prefix, are what a head reads in their place.)"""
        if own is None:
            return self.prefill(inputs, room)[1]
        return self.prefill_continued(inputs["input_ids"][:, own.covers :], own, room)[1]

    def prefix_of(self, slot: int, length: int, covers: int) -> CachedPrefix:
        """What `slot` (a row, or a slot a prompt pass wrote) holds of a sequence's first `covers` tokens, in its
        first `length` entries (a row's offset places the next token)."""
        offset = self.offsets[slot] if slot < len(self.offsets) else self._written_offset(slot)
        return CachedPrefix(self.cache.entries(slot, length), covers, length + offset)

    def _written_offset(self, slot: int) -> int:
        """The position offset of the prompt a pass wrote into `slot` (not yet a row)."""
        return next(prompt.offset for prompt in self.cache.prompts_written if slot in prompt.held)

    def take(self, prompt: PromptSlot, room: int) -> int:
        """Take in a prompt a pass wrote (or that a row holds: draws of one prompt) as a new row, with `room` more
        tokens (and a tree's) to come; returns its row."""
        self.offsets.append(prompt.offset)
        return self.cache.take(prompt, room + TREE_ROOM)

    def discard(self, rows: int) -> None:
        """Forget every row from index `rows` on (what a failed admission may have left)."""
        if self.cache.rows > rows:
            self.drop(list(range(rows, self.cache.rows)))

    def drop(self, rows: list[int]) -> list[int]:
        """Remove finished rows (a freed slot takes the last row); returns the new order as old row indices."""
        order = self.cache.drop(rows)
        self.offsets = [self.offsets[b] for b in order]
        return order

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
        """Every row feeds `tokens` (B, q) at positions `start[b] + depths` (`depths` (q,) or (B, q)); row b's first
        `counts[b]` (all, by default) enter its cache. With `visible` (q, w), as `with_edges` gives it (q, w + 2),
        every row's query i sees, of the row's last w keys after this forward (its own and earlier tree levels'), the
        marked ones, and every key before them; with (B, q, w + 2) each row marks its own (trees of different
        shapes); with None, the row's keys up to its own (a causal block). Returns the logits (B, q, V). A fixed
        number of operations, whatever the rows. `eager` runs the model's own forward where a compiled one is held
        (what the compile check compares the compiled forwards with). `features` (B, q, F): what a draft head reads
        beside each token (the target's hidden states before it); a model reads none."""
        return self._forward(tokens, depths, start, visible, counts, eager, features)[0]

    def verify(
        self,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        start: torch.Tensor,
        visible: torch.Tensor | None,
        counts: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward_rows`, and the features the forward's `tap` kept of every token (B, q, 3H) as it ran (None
        without a tap): what a draft head reads next."""
        logits = self.forward_rows(tokens, depths, start, visible, counts)
        if self.tap is None:
            return logits, None
        return logits, self.tap.take(tokens.shape[0], tokens.shape[1])

    def _forward(
        self,
        tokens: torch.Tensor,
        depths: torch.Tensor,
        start: torch.Tensor,
        visible: torch.Tensor | None,
        counts: list[int] | None,
        eager: bool,
        features: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward_rows`' logits (B, q, V), and a head's pre-norm output (B, q, H) (None for a model)."""
        cache, device = self.cache, self.device
        rows, q = tokens.shape
        cache.prepare(self._fed(q))
        counts = [q] * rows if counts is None else counts
        if cache.fixed:
            visible = _row_visible(visible, rows, q, device)
            return self._run_fixed(tokens, start, depths, visible, counts, eager, features)
        positions = start[:, None] + depths
        if rows == 1 and q == 1 and visible is None:
            # One token sees every key: unmasked, as `generate`'s step attends (a plain step).
            return self._run(tokens, positions, None, counts, features)
        if rows == 1:
            # One row sees every key before its block: the mask covers the block alone, and the prefix is attended
            # unmasked on the fused kernel (`tree_block_attention`), whose cost stays flat as long prompts grow.
            block = arange(q, device)[None, :] <= arange(q, device)[:, None] if visible is None else visible[..., 1:-1]
            return self._run(tokens, positions, block.reshape(1, q, -1), counts, features)
        relative = arange(cache.span, device)[None, :] - cache.starts[:rows, None]
        if visible is None:
            seen = relative[:, None, :] <= arange(q, device)[None, :, None]
        else:
            width = visible.shape[-1] - 2
            columns = (relative - (q - width - 1)).clamp(0, width + 1)
            if visible.ndim == 2:
                seen = visible[:, columns].transpose(0, 1)
            else:
                seen = visible.gather(2, columns[:, None, :].expand(-1, q, -1))
        return self._run(tokens, positions, seen, counts, features)

    def warm_up(self, largest: int) -> None:
        """Run the compiled forward once at every padded size up to `largest` tokens over the rows (compiling each),
        leaving the cache as it was."""
        lengths, device = list(self.cache.lengths), self.device
        start = host_values(self.positions(lengths), device)
        for size in padded_sizes(largest):
            if self.compiled is None:
                return
            tokens = torch.zeros(len(lengths), size, dtype=torch.long, device=device)
            self.forward_rows(tokens, arange(size + 1, device)[1:], start, None)
            self.cache.lengths = list(lengths)

    def check_compiled(self, first: torch.Tensor) -> None:
        """Once per model under `compile="auto"`, before the rows' first step: from each row's next token `first` (B,),
        decode `CHECK_TOKENS` tokens greedily through the compiled forwards and through eager ones (of the same fixed
        shapes), one token at a time and then the same tokens as one causal block, and report to the guard whether
        both chose the same tokens. The cache is left as it was."""
        if self.guard is not None:
            self.guard.check(self, lambda compiled: self._greedy_check(first, compiled))

    def _greedy_check(self, first: torch.Tensor, compiled: bool) -> list[list[int]]:
        """The tokens `check_compiled` compares, from one run of fixed-shape forwards, compiled or eager."""
        lengths, device = list(self.cache.lengths), self.device
        start = host_values(self.positions(lengths), device)
        fed, chosen = [first.to(device)], []
        try:
            for i in range(CHECK_TOKENS):
                logits = self.forward_rows(fed[-1][:, None], arange(1, device), start + i, None, eager=not compiled)
                chosen.append(logits[:, -1].argmax(-1))
                fed.append(chosen[-1])
            self.cache.lengths = list(lengths)
            block = torch.stack(fed[:-1], 1)
            logits = self.forward_rows(block, arange(CHECK_TOKENS, device), start, None, eager=not compiled)
            chosen += list(logits.argmax(-1).T)
        finally:
            self.cache.lengths = lengths
        return torch.stack(chosen, 1).tolist()

    def positions(self, index: list[int]) -> list[int]:
        """The positions of each row's token at cache index `index[b]` (host numbers: the caller copies them to the
        device with whatever else it copies)."""
        return [offset + i for offset, i in zip(self.offsets, index, strict=True)]

    def entries(self, tokens: int) -> int:
        """The cache entries a prompt of `tokens` (kept) tokens takes: one a token (a head's one fewer: each entry
        holds a token beside the feature before it)."""
        return tokens

    @property
    def keeps_tree(self) -> bool:
        """Whether a step's commit keeps the accepted nodes a drafter was fed in its cache (a model's entries are its
        tokens'; a head's were made from its own outputs and are fed again with the target's features)."""
        return True

    def _fed(self, q: int) -> int:
        """The tokens a forward of `q` feeds each row: `q`, padded on a fixed cache."""
        return padded_size(q) if self.cache.fixed else q

    def _run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        seen: torch.Tensor | None,
        counts: list[int],
        features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The eager forward over `tokens` (B, q) at `positions`, each query seeing the keys `seen` (B, q, span) marks
        (None: every key, no mask), a head reading `features`; the first `counts[b]` of row b enter its cache.
        Returns the logits (B, q, V) and a head's pre-norm output (None for a model)."""
        mask = None if seen is None else torch.where(seen, self._zero, torch.finfo(self.dtype).min)[:, None]
        position_ids = self.adapter.position_ids(positions.reshape(-1))
        position_ids = position_ids.reshape(*position_ids.shape[:-2], *tokens.shape)
        inputs = dict(
            input_ids=tokens, position_ids=position_ids, attention_mask=mask, cache=self.cache, use_cache=True
        )
        if features is not None:
            inputs["features"] = features
        with tree_attention(self.adapter.language_model.config):
            out = self.adapter.model(**inputs)
        self.cache.commit(counts)
        return out.logits.to(self.device), out.hidden_states if features is not None else None

    def _run_fixed(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        depths: torch.Tensor,
        visible: torch.Tensor,
        counts: list[int],
        eager: bool,
        features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fixed-shape forward (`fixed_forward`) over `tokens` (B, q) at `start[b] + depths` under the tree block
        `visible` (B, q, w + 2), a head reading `features`, through the compiled form (one region) unless `eager` or
        none is held; the first `counts[b]` tokens of row b enter its cache. Returns the logits (B, q, V) and a head's
        pre-norm output (B, q, H) (None for a model)."""
        rows, q = tokens.shape
        cache = self.cache
        slots = arange(padded_size(q), self.device)
        tokens, visible = _standard(tokens), _standard(visible)
        depths = _standard(self._depth_form(depths, rows))
        features = None if features is None else _standard(features)
        arguments = (self.adapter.position_ids, cache, tokens, start, depths, visible, cache.starts, slots, features)
        with tree_attention(self.adapter.language_model.config):
            if self.compiled is None or eager:
                logits, hidden = fixed_forward(self.adapter.model, *arguments)
            else:
                mark_varying(tokens, start, depths, visible, cache.starts, slots, features)
                try:
                    logits, hidden = self.compiled(*arguments)
                except Exception as error:
                    if self.guard is None:
                        raise
                    self.guard.fall_back(f"the {self.role}'s compiled {tuple(tokens.shape)} forward", error)
                    logits, hidden = fixed_forward(self.adapter.model, *arguments)
        self.cache.commit(counts)
        logits, hidden = logits[:rows], None if hidden is None else hidden[:rows, :q]
        # A CUDA graph's outputs live in its memory pool, which its next replay overwrites.
        if logits.device.type == "cuda":
            return logits.clone(), None if hidden is None else hidden.clone()
        return logits.to(self.device), hidden

    def _depth_form(self, depths: torch.Tensor, rows: int) -> torch.Tensor:
        """`depths` in the one form this model's fixed forwards take, so that a graph never compiles again for
        another rank or stride: every row's own (B, q) where `row_depths` (the target: rows verify trees of their
        own shapes), else the rows' shared (q,) (a view: `_standard` copies it where its strides are not a
        contiguous tensor's)."""
        if self.row_depths:
            return depths if depths.ndim == 2 else depths.expand(rows, -1)
        return depths if depths.ndim == 1 else depths[0]

    def keep_rows(self, starts: list[int], offsets: torch.Tensor, counts: list[int]) -> None:
        """In each row b, of the entries from `starts[b]` on keep those at its first `counts[b]` `offsets` (B, W)."""
        self.cache.keep_rows(starts, offsets.to(self.device), counts)


def _standard(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with a contiguous tensor's strides, copied only where its own differ (a slice, an expanded view, a
    row of one whose other strides are not its size's): a compiled graph checks its inputs' strides, even those of a
    dimension of size 1, and would compile again for each other layout."""
    strides, stride = [], 1
    for size in reversed(tensor.shape):
        strides.append(stride)
        stride *= size
    if tensor.stride() == tuple(reversed(strides)):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


#: Per device, row count and tokens: the causal block every row's tokens see (`_row_visible`), kept.
_CAUSAL: dict[tuple[torch.device, int, int], torch.Tensor] = {}


def _row_visible(visible: torch.Tensor | None, rows: int, q: int, device: torch.device) -> torch.Tensor:
    """`forward_rows`' `visible` as every row's own contiguous (B, q, w + 2) block (the form `fixed_forward` takes, so
    that one compiled graph serves them all): a shared (q, w + 2) block copied to each row, and None (a causal block:
    every key before the tokens, and each token those up to its own) from a kept tensor."""
    if visible is not None:
        return (visible.expand(rows, -1, -1) if visible.ndim == 2 else visible).contiguous()
    key = (torch.device(device), rows, q)
    causal = _CAUSAL.get(key)
    if causal is None:
        block = torch.ones(q, q, dtype=torch.bool, device=device).tril()
        edges = torch.zeros(q, 1, dtype=torch.bool, device=device)
        causal = _CAUSAL[key] = torch.cat([~edges, block, edges], 1).expand(rows, -1, -1).contiguous()
    return causal
