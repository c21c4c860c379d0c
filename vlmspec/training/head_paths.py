"""VSD's draft side for a head (`vsd.vsd_step_loss`'s `paths`): the head reads a prefix as its prompt pass reads one
(each kept token after the first beside the target's feature of the token before it, taken in the target's forward
over the prefix just before), then drafts a path as a chain of tree levels, each token beside the head's own output
for the token before it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..adapters import ModelAdapter
from ..engine.features import FeatureTap
from ..heads import Eagle3Head
from .head_examples import HeadInputs, entries_pass
from .vsd import VSDConfig, repeated_cache

#: The log-probability a path's token outside the draft vocabulary gets: the head cannot propose it, and the path's
#: weight stays finite.
OUTSIDE = -30.0


@dataclass
class HeadPrefix:
    """The head's cache after a prefix's entries, the position of its next entry, the last entry's logits `(V,)` and
    its pre-norm output `(H,)` (what the path's first token is fed beside)."""

    cache: DynamicCache
    next_position: int
    last_logits: torch.Tensor
    last_hidden: torch.Tensor


class HeadPaths:
    """A head's prefix, sampled paths and path scores, reading the features `tap` keeps of the target's last
    forward."""

    def __init__(self, head: Eagle3Head, tap: FeatureTap, target_adapter: ModelAdapter):
        self.head, self.tap, self.adapter = head, tap, target_adapter

    def prefix(self, inputs: dict, keep: torch.Tensor | None) -> HeadPrefix:
        """The head's entries of the prefix `inputs` (those `keep` (L,) keeps), with gradient."""
        ids = inputs["input_ids"][0]
        positions = self.adapter.prompt_positions(inputs)[..., 0, :]
        entries = torch.ones(ids.shape[0] - 1, dtype=torch.bool, device=ids.device)
        if keep is not None:
            entries = keep[:-1].to(ids.device)
        cache = DynamicCache(config=self.head.config)
        out = entries_pass(self.head, HeadInputs(ids, self.tap.take()[0], positions, entries), cache)
        last = int(positions[..., :-1][..., entries][..., -1].max())
        return HeadPrefix(cache, last + 1, out.logits[0, -1], out.hidden_states[0, -1])

    def _level(self, prefix: HeadPrefix, cache, tokens: torch.Tensor, hidden: torch.Tensor, step: int):
        """One level of every path: `tokens` (N, 1) beside `hidden` (N, 1, H) at the prefix's next position + step."""
        ids = self.adapter.position_ids(torch.tensor([prefix.next_position + step]))
        ids = ids.expand(*ids.shape[:-2], tokens.shape[0], 1).to(tokens.device)
        return self.head(input_ids=tokens, position_ids=ids, features=hidden, cache=cache, logits_to_keep=1)

    @torch.no_grad()
    def sample(self, prefix: HeadPrefix, config: VSDConfig, vocab_limit: int, generator) -> torch.Tensor:
        """`(S, L)` paths drawn from the head, level by level."""
        rows = config.samples
        cache = repeated_cache(self.head, prefix, rows, detach=True)
        logits = prefix.last_logits[:vocab_limit].detach().float().expand(rows, -1)
        hidden = prefix.last_hidden.detach().expand(rows, 1, -1)
        tokens = []
        for step in range(config.length):
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            tokens.append(token)
            if step + 1 < config.length:
                out = self._level(prefix, cache, token, hidden, step)
                logits, hidden = out.logits[:, -1, :vocab_limit].float(), out.hidden_states
        return torch.cat(tokens, 1)

    def log_probs(self, prefix: HeadPrefix, paths: torch.Tensor, vocab_limit: int) -> torch.Tensor:
        """`(N, L)` the head's log-probability of each token of `paths` `(N, L)` after the prefix, with gradient
        (`OUTSIDE` for tokens outside its draft vocabulary)."""
        rows, length = paths.shape
        cache = repeated_cache(self.head, prefix, rows)
        first = torch.log_softmax(prefix.last_logits[:vocab_limit].float(), -1).expand(rows, -1)
        logs, hidden = [first.gather(1, paths[:, :1])], prefix.last_hidden.expand(rows, 1, -1)
        for step in range(length - 1):
            out = self._level(prefix, cache, paths[:, step : step + 1], hidden, step)
            logs.append(
                torch.log_softmax(out.logits[:, -1, :vocab_limit].float(), -1).gather(1, paths[:, step + 1 :][:, :1])
            )
            hidden = out.hidden_states
        return torch.cat(logs, 1).clamp_min(OUTSIDE)
