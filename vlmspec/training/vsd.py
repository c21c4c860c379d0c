"""VSD's E-step and M-step on the models (Algorithm 1 of the seed paper `002`): at a few anchor positions of a
response, the draft proposes S paths of L tokens (sampled), the target scores them, the oracle keeps those at least as
valid as the target's greedy path, the target's own continuation (the response) replaces the others, and the draft's
weighted likelihood of the result is the loss (`objectives.vsd_loss`, eq. 17). The draft reads the prompt's kept
tokens, as when it decodes. What the draft does (read a prefix, sample paths after it, score paths) is its `paths`
object's: `ModelPaths` for a VLM draft, `head_paths.HeadPaths` for a head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from ..adapters import ModelAdapter
from ..processors import append_tokens
from .examples import Example
from .objectives import CAR_TEMPERATURE, length_weights, log_path_validity, oracle, vsd_loss


@dataclass(frozen=True)
class VSDConfig:
    """`samples` S draft paths of `length` L tokens at each of `anchors` positions of a response (the paper: L = 7,
    S = 40 on GPUs), CAR's `temperature`, and the VSD term's `weight` beside the token-level distillation (the ELBO's
    KL term, eq. 7)."""

    samples: int = 8
    length: int = 4
    anchors: int = 2
    temperature: float = CAR_TEMPERATURE
    weight: float = 1.0


@dataclass
class Prefix:
    """A model's cache after reading a prefix, and the position of the token after it."""

    cache: DynamicCache
    next_position: int
    last_logits: torch.Tensor


def read_prefix(model: PreTrainedModel, adapter: ModelAdapter, inputs: dict, keep: torch.Tensor | None) -> Prefix:
    """Run `model` over a prefix (its processor outputs, the kept tokens where `keep` (L,) is given) into a cache."""
    cache = DynamicCache(config=model.config)
    positions = adapter.prompt_positions(inputs)
    with adapter.pruned(None if keep is None else keep[None]):
        out = model(
            **adapter.model_inputs(inputs), position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
    return Prefix(cache, int(positions[..., -1].max()) + 1, out.logits[0, -1])


def repeated_cache(model: PreTrainedModel, prefix: Prefix, rows: int, detach: bool = False) -> DynamicCache:
    """A new cache holding the prefix's keys and values for `rows` rows (the prefix's own cache stays as it is)."""
    cache = DynamicCache(config=model.config)
    for index, layer in enumerate(prefix.cache.layers):
        keys, values = (layer.keys.detach(), layer.values.detach()) if detach else (layer.keys, layer.values)
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
    return cache


def _path_log_probs(
    model: PreTrainedModel, adapter: ModelAdapter, prefix: Prefix, paths: torch.Tensor, vocab_limit: int
) -> torch.Tensor:
    """`(N, L)` the log-probability `model` gives each token of `paths` `(N, L)` after the prefix (the prefix's cache
    repeated for the N paths; gradient flows where the cache carries it)."""
    rows, length = paths.shape
    cache = repeated_cache(model, prefix, rows)
    positions = adapter.position_ids(torch.arange(prefix.next_position, prefix.next_position + length - 1))
    first = torch.log_softmax(prefix.last_logits[:vocab_limit].float(), -1).expand(rows, -1)
    logs = [first.gather(1, paths[:, :1])]
    if length > 1:
        ids = positions.expand(*positions.shape[:-2], rows, length - 1).to(paths.device)
        out = model(input_ids=paths[:, :-1], position_ids=ids, cache=cache, use_cache=True)
        rest = torch.log_softmax(out.logits[..., :vocab_limit].float(), -1)
        logs.append(rest.gather(2, paths[:, 1:, None])[..., 0])
    return torch.cat(logs, 1)


@torch.no_grad()
def _sample_paths(
    draft: PreTrainedModel,
    adapter: ModelAdapter,
    prefix: Prefix,
    config: VSDConfig,
    vocab_limit: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """`(S, L)` paths sampled from the draft after its prefix, token by token."""
    rows = config.samples
    cache = repeated_cache(draft, prefix, rows, detach=True)
    logits = prefix.last_logits[:vocab_limit].detach().float().expand(rows, -1)
    tokens = []
    for step in range(config.length):
        token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        tokens.append(token)
        if step + 1 < config.length:
            ids = adapter.position_ids(torch.tensor([prefix.next_position + step]))
            ids = ids.expand(*ids.shape[:-2], rows, 1).to(token.device)
            logits = draft(input_ids=token, position_ids=ids, cache=cache, use_cache=True).logits[:, -1, :vocab_limit]
            logits = logits.float()
    return torch.cat(tokens, 1)


class DraftPaths(Protocol):
    """The draft's side of VSD: read a prefix (its processor outputs, the kept tokens where `keep` says), sample
    `(S, L)` paths after it, and score `(N, L)` paths with gradient."""

    def prefix(self, inputs: dict, keep: torch.Tensor | None) -> Any: ...

    def sample(self, prefix: Any, config: VSDConfig, vocab_limit: int, generator) -> torch.Tensor: ...

    def log_probs(self, prefix: Any, paths: torch.Tensor, vocab_limit: int) -> torch.Tensor: ...


class ModelPaths:
    """VSD's draft side for a VLM draft: it reads the prefix's kept tokens into a cache, samples paths token by token
    and scores paths (with gradient)."""

    def __init__(self, model: PreTrainedModel, adapter: ModelAdapter):
        self.model, self.adapter = model, adapter

    def prefix(self, inputs: dict, keep: torch.Tensor | None) -> Prefix:
        return read_prefix(self.model, self.adapter, inputs, keep)

    def sample(self, prefix: Prefix, config: VSDConfig, vocab_limit: int, generator) -> torch.Tensor:
        return _sample_paths(self.model, self.adapter, prefix, config, vocab_limit, generator)

    def log_probs(self, prefix: Prefix, paths: torch.Tensor, vocab_limit: int) -> torch.Tensor:
        return _path_log_probs(self.model, self.adapter, prefix, paths, vocab_limit)


def vsd_step_loss(
    target: PreTrainedModel,
    target_adapter: ModelAdapter,
    paths: DraftPaths,
    example: Example,
    config: VSDConfig,
    vocab_limit: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """The VSD term of one example, averaged over its anchors (None where the response is too short for a path);
    `paths` is the draft's side (`ModelPaths`, or a head's `HeadPaths`)."""
    response = example.response
    last = response.shape[0] - config.length
    if last < 0:
        return None
    anchors = torch.randperm(last + 1, generator=generator)[: config.anchors].tolist()
    losses = [_anchor_loss(target, target_adapter, paths, example, t, config, vocab_limit, generator) for t in anchors]
    return torch.stack(losses).mean()


def _anchor_loss(
    target: PreTrainedModel,
    target_adapter: ModelAdapter,
    paths: DraftPaths,
    example: Example,
    anchor: int,
    config: VSDConfig,
    vocab_limit: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Algorithm 1 at one anchor: E-step (proposals, oracle, correction) then the M-step's loss. The draft reads its
    prefix right after the target's forward over it (a head reads that forward's features)."""
    inputs = append_tokens(example.inputs, example.response[:anchor])
    keep = None
    if example.keep is not None:
        keep = torch.cat([example.keep, torch.ones(anchor, dtype=torch.bool, device=example.keep.device)])
    continuation = example.response[anchor : anchor + config.length][None]
    with torch.no_grad():
        target_prefix = read_prefix(target, target_adapter, inputs, None)
    drafted = paths.prefix(inputs, keep)
    with torch.no_grad():
        greedy = _greedy_path(target, target_adapter, target_prefix, config.length, vocab_limit)
    proposals = paths.sample(drafted, config, vocab_limit, generator)
    with torch.no_grad():
        scored = torch.cat([proposals, continuation, greedy])
        target_logs = _path_log_probs(target, target_adapter, target_prefix, scored, vocab_limit)
    draft_logs = paths.log_probs(drafted, torch.cat([proposals, continuation]), vocab_limit)
    with torch.no_grad():
        greedy_draft = paths.log_probs(drafted, greedy, vocab_limit)
        validity = log_path_validity(target_logs[:-1], draft_logs.detach())
        greedy_validity = log_path_validity(target_logs[-1:], greedy_draft)[0]
        weights = length_weights(config.length, device=validity.device)
        marks = oracle(validity, greedy_validity, weights)  # (S + 1, L): the proposals, then the continuation
        proposed = marks[:-1].T  # (L, S): o~
        kept = torch.where(proposed > 0, proposed, marks[-1][:, None].expand_as(proposed))  # o'
    cumulative = draft_logs.cumsum(1)
    proposal_logs = cumulative[:-1].T
    kept_logs = torch.where(proposed > 0, proposal_logs, cumulative[-1][:, None].expand_as(proposal_logs))
    return vsd_loss(kept_logs, proposal_logs, kept, proposed, config.temperature)


def _greedy_path(
    target: PreTrainedModel, adapter: ModelAdapter, prefix: Prefix, length: int, vocab_limit: int
) -> torch.Tensor:
    """`(1, L)` the target's greedy continuation of its prefix (its oracle's baseline, Algorithm 2)."""
    cache = repeated_cache(target, prefix, 1)
    token = prefix.last_logits[:vocab_limit].argmax()[None, None]
    tokens = [token]
    for step in range(length - 1):
        ids = adapter.position_ids(torch.tensor([prefix.next_position + step])).to(token.device)
        out = target(input_ids=token, position_ids=ids, cache=cache, use_cache=True)
        token = out.logits[:, -1, :vocab_limit].argmax(-1, keepdim=True)
        tokens.append(token)
    return torch.cat(tokens, 1)
