"""A draft head's unrolled pass over one training example, as it runs at decoding: its prompt entries (the kept
ones) and the response's, each token beside the target's feature of the token before it (taken in the target's own
forward over the example), then the training-time test's later steps, each chain beside its own last output
(`head_objectives`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..engine.tree import additive_mask
from ..heads import Eagle3Head
from ..heads.module import HeadOutput
from .examples import Example
from .head_objectives import restricted, soft_cross_entropy, unrolled_mask, unrolled_rows


@dataclass
class HeadInputs:
    """The example's sequence as the head reads it: `ids` `(T,)` (prompt then response), the target's `features`
    `(T, 3H)` and `positions` `(..., T)` (the target's position ids of each token), and which positions j < T - 1
    feed an entry (`entries` bool; for training `(T - 2,)`, kept by pruning: the last token's entry would predict
    past what the target scored)."""

    ids: torch.Tensor
    features: torch.Tensor
    positions: torch.Tensor
    entries: torch.Tensor


def head_inputs(example: Example, features: torch.Tensor, positions: torch.Tensor) -> HeadInputs:
    """`example`'s `HeadInputs` from the target's `features` `(1, T, 3H)` and position ids `(..., 1, T)` over it."""
    ids = torch.cat([example.inputs["input_ids"][0], example.response.to(example.inputs["input_ids"].device)])
    entries = torch.ones(ids.shape[0] - 2, dtype=torch.bool, device=ids.device)
    if example.keep is not None:
        entries[: example.prompt_length - 1] = example.keep[: example.prompt_length - 1].to(ids.device)
    return HeadInputs(ids, features[0], positions[..., 0, :], entries)


def trailing_run(mask: torch.Tensor) -> int:
    """How many of `mask`'s last entries are True in a row."""
    flipped = mask.flip(0).to(torch.int64)
    return int(flipped.cumprod(0).sum())


def entries_pass(head: Eagle3Head, seen: HeadInputs, cache: DynamicCache) -> HeadOutput:
    """The head's prompt pass over `seen`'s entries into `cache`, with gradient: each entry's token (the one after
    its position) beside the target's feature at its position, at that position, attending causally."""
    index = seen.entries.nonzero().squeeze(1)
    causal = torch.ones(len(index), len(index), dtype=torch.bool, device=index.device).tril()
    return head(
        input_ids=seen.ids[index + 1][None],
        position_ids=seen.positions[..., index][..., None, :],
        features=seen.features[index][None],
        attention_mask=additive_mask(causal, head.fc.weight.dtype),
        cache=cache,
        logits_to_keep=1,
    )


def unrolled_outputs(head: Eagle3Head, seen: HeadInputs, chains: int, steps: int) -> list[torch.Tensor]:
    """The head's pre-norm outputs of each unrolled step, with gradient: step k's `(chains - k, H)` for the chains,
    the last `chains` entries (a contiguous run of kept ones)."""
    entries = int(seen.entries.sum())
    cache = DynamicCache(config=head.config)
    outputs = [entries_pass(head, seen, cache).hidden_states[0, entries - chains :]]
    for step in range(1, steps):
        outputs.append(_step(head, seen, cache, outputs[-1][: chains - step], entries, chains, step))
    return outputs


def unrolled_losses(
    head: Eagle3Head, example: Example, seen: HeadInputs, steps: int, draft_ids: torch.Tensor
) -> list[torch.Tensor]:
    """Each unrolled step's soft cross-entropy (`head_objectives`), step 0 first, with gradient. Chains are the last
    response + steps - 1 entries (fewer where pruning cut into them), so that every response token is predicted at
    every step it can be."""
    response = example.response.shape[0]
    chains = min(response + steps - 1, trailing_run(seen.entries))
    targets = restricted(example.target_probs, draft_ids.to(example.target_probs.device))
    losses = []
    for step, hidden in enumerate(unrolled_outputs(head, seen, chains, steps)):
        rows, valid = unrolled_rows(example.prompt_length, response, chains, step)
        log_probs = torch.log_softmax(head.draft_logits(hidden).float(), dim=-1)
        losses.append(soft_cross_entropy(log_probs, targets[rows], valid.to(log_probs.device)))
    return losses


def _step(
    head: Eagle3Head, seen: HeadInputs, cache, fed: torch.Tensor, entries: int, chains: int, step: int
) -> torch.Tensor:
    """Unrolled step `step`: each of the first `chains - step` chains' next token beside its own last output `fed`,
    at the next position; returns the step's outputs `(chains - step, H)`."""
    total = seen.ids.shape[0]
    chain = total - 2 - chains + torch.arange(chains - step, device=seen.ids.device)
    out = head(
        input_ids=seen.ids[chain + 1 + step][None],
        position_ids=seen.positions[..., chain + step][..., None, :],
        features=fed[None],
        attention_mask=additive_mask(unrolled_mask(entries, chains, step, seen.ids.device), head.fc.weight.dtype),
        cache=cache,
        logits_to_keep=1,
    )
    return out.hidden_states[0]
