"""What a draft head is trained to minimise: EAGLE-3's training-time test (Li et al., "EAGLE-3: Scaling up Inference
Acceleration of Large Language Models via Training-Time Test", 2025, section 3), each piece a pure function of tensors.

At decoding a head's first level reads the target's features, and every later level its own outputs. The training-time
test trains it so: step 0 feeds every entry j (token j + 1 beside the target's feature at j, at j's position, for j up
to the sequence's third-last token: the last entry would predict past what the target scored); step k
feeds each chain j its next token, j + 1 + k, beside the head's own output of step k - 1 for that chain, at j + k's
position, attending to step 0's entries up to j's and to its own chain's entries of steps 1..k. Its output then
predicts the token after j + 1 + k. Each step's loss is the soft cross-entropy

    L_k = - mean_j sum_{v in draft vocabulary} p_hat(v | x_<=j+1+k) log q_k(v | j)

against the target's distribution p restricted to the draft vocabulary and renormalised (p_hat), and the steps are
weighted 0.8^k (SpecForge's and EAGLE-3's released training code): L = sum_k 0.8^k L_k.
"""

from __future__ import annotations

import torch

#: The weight of unrolled step k is STEP_WEIGHT ** k.
STEP_WEIGHT = 0.8


def step_weights(steps: int, base: float = STEP_WEIGHT) -> torch.Tensor:
    """`(steps,)`: `base ** k` for k = 0..steps-1."""
    return base ** torch.arange(steps, dtype=torch.float32)


def unrolled_mask(entries: int, chains: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Which keys the queries of unrolled step `step` >= 1 see, `(chains - step, entries + sum_{i=1..step} (chains -
    i))` bool. The chains are the last `chains` of step 0's `entries` entries; step i holds chains 0..chains-i-1 (a
    chain's next token runs out at the sequence's end). Chain c sees step 0's entries up to its own (entries - chains
    + c) and, of each step 1..`step`, its own entry alone."""
    queries = torch.arange(chains - step, device=device)
    first = torch.arange(entries, device=device)[None, :] <= (entries - chains + queries)[:, None]
    own = [queries[:, None] == torch.arange(chains - i, device=device)[None, :] for i in range(1, step + 1)]
    return torch.cat([first, *own], dim=1)


def unrolled_rows(prompt: int, response: int, chains: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For unrolled step `step`, each chain's row of the target's distributions over the response (row r: after the
    token before response token r), and whether it has one. The sequence has `prompt` + `response` tokens, the
    entries are j = 0 .. T - 3 (the last token predicts nothing the target scored), and chain c is entry j = T - 2 -
    `chains` + c, whose step `step` predicts the token after j + 1 + `step`: the response's token j + 2 + `step` -
    `prompt`. Returns `(chains - step,)` long rows (clamped into range) and bool."""
    total = prompt + response
    entries = total - 2 - chains + torch.arange(chains - step)
    rows = entries + 2 + step - prompt
    valid = (rows >= 0) & (rows < response)
    return rows.clamp(0, max(response - 1, 0)), valid


def restricted(target_probs: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """The target's distribution `(N, V)` restricted to the draft vocabulary `draft_ids` `(Vd,)` and renormalised,
    `(N, Vd)` (a row with no mass there is left at zero)."""
    kept = target_probs[:, draft_ids]
    return kept / kept.sum(-1, keepdim=True).clamp_min(1e-30)


def soft_cross_entropy(log_probs: torch.Tensor, target_probs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`- sum_v p(v) log q(v)`, averaged over the `valid` rows `(N,)` of `log_probs` and `target_probs` `(N, Vd)`;
    zero when no row is valid."""
    per_row = -(target_probs * log_probs).sum(-1)
    return (per_row * valid).sum() / valid.sum().clamp_min(1)


def ttt_loss(steps: list[torch.Tensor], base: float = STEP_WEIGHT) -> torch.Tensor:
    """`sum_k base^k L_k` over the unrolled steps' losses `L_k` (0-d tensors, step 0 first)."""
    weights = step_weights(len(steps), base).to(steps[0].device)
    return (torch.stack(steps) * weights).sum()
