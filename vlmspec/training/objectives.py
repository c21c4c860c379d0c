"""What a draft is trained to minimise: token-level distillation (`kd_loss`) and the pieces of Variational Speculative
Decoding (VSD; Wang et al., the seed paper `002`, section 4 and appendix A), each a pure function of tensors.

VSD treats a draft path z = (z_1, ..., z_l) after a prefix x as a latent proposal. The target accepts token z_i with
probability alpha_i = min(1, p(z_i | x, z_<i) / q(z_i | x, z_<i)) (eq. 1), so the whole path survives verification
with probability kappa(x, z) = prod_i alpha_i (eq. 2). The draft maximises an ELBO on the marginal acceptance,
E_q[log kappa] - KL(q || p) (eq. 7), by EM: the E-step samples S paths from the draft and keeps those an oracle
accepts, replacing the others by the target's own continuation (Algorithm 1); the M-step maximises the kept paths'
weighted likelihood with a control variate (ARW, beta) on the proposals' own likelihood, weighted by the draft's
confidence in them (CAR, zeta) (eq. 17).
"""

from __future__ import annotations

import torch

#: The paper's defaults (appendix E): the length weight w(l) = 1.05 ** l and CAR's temperature.
LENGTH_WEIGHT_BASE = 1.05
CAR_TEMPERATURE = 0.2


def kd_loss(draft_log_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Forward KL from the target's distribution to the draft's, `sum_v p(v) (log p(v) - log q(v))`, averaged over
    positions: `draft_log_probs` and `target_probs` are `(N, V)` (log-probabilities and probabilities over the same
    ids). Its gradient in the draft's logits is `q - p`, the standard token-level distillation."""
    target_log = target_probs.clamp_min(1e-30).log()
    return (target_probs * (target_log - draft_log_probs)).sum(-1).mean()


def log_path_validity(target_log_probs: torch.Tensor, draft_log_probs: torch.Tensor) -> torch.Tensor:
    """`log kappa` of every prefix of every path (eq. 2, cumulated): `(..., L)` log-probabilities the target and the
    draft give each path's tokens; returns `(..., L)` whose entry l is `sum_{i<=l} min(0, log p_i - log q_i)`."""
    return (target_log_probs - draft_log_probs).clamp_max(0.0).cumsum(-1)


def length_weights(length: int, base: float = LENGTH_WEIGHT_BASE, device: torch.device | None = None) -> torch.Tensor:
    """`w(l) = base ** l` for l = 1..length (appendix E: any bounded 1 < w < 2 does; the paper fixes 1.05 ** l)."""
    return base ** torch.arange(1, length + 1, dtype=torch.float32, device=device)


def oracle(log_validity: torch.Tensor, greedy_log_validity: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Algorithm 2: `o(z_<l, x) = w(l) * I[log kappa(x, z_<l) >= log kappa(x, zbar_<l)]`, for paths' prefix
    validities `(..., L)` against the greedy target path's `(L,)` (broadcast), with `weights` `(L,)` the w(l)."""
    return weights * (log_validity >= greedy_log_validity).to(weights.dtype)


def rejection_weights(kept: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
    """ARW's control variate (eq. 15 / 19), leave-one-out over the S samples: `beta[l, s] = sum_{j != s} o'[l, j]
    o~[l, j] / sum_{j != s} o'[l, j]`, from `kept` o' (the corrected paths' oracle weights) and `proposed` o~ (the
    proposals' own validity, 0 or 1), both `(L, S)`. A sample with no other weighted sample beside it gets 0."""
    proposed = (proposed > 0).to(kept.dtype)
    numerator = (kept * proposed).sum(-1, keepdim=True) - kept * proposed
    denominator = kept.sum(-1, keepdim=True) - kept
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-12), torch.zeros_like(kept))


def confidence_weights(proposal_probs: torch.Tensor, temperature: float = CAR_TEMPERATURE) -> torch.Tensor:
    """CAR (eq. 16 / 20): `zeta[l, s] = exp(q(z~_<l^(s)) / tau) / sum_j exp(q(z~_<l^(j)) / tau)`, a softmax over the
    S proposals `(L, S)` of the probability the draft gives each (not its log, as the paper writes it)."""
    return torch.softmax(proposal_probs / temperature, dim=-1)


def vsd_loss(
    kept_log_probs: torch.Tensor,
    proposal_log_probs: torch.Tensor,
    kept: torch.Tensor,
    proposed: torch.Tensor,
    temperature: float = CAR_TEMPERATURE,
) -> torch.Tensor:
    """The M-step's loss, whose gradient is minus eq. 17's estimator:

        g = 1 / sum o' * sum_{l, s} o'[l, s] (grad log q(z_<l^(s)) - beta[l, s] zeta[l, s] grad log q(z~_<l^(s)))

    `kept_log_probs` and `proposal_log_probs` `(L, S)` are the draft's log-likelihoods (with gradient) of each
    corrected path z and each proposal z~ up to length l; `kept` o' and `proposed` o~ `(L, S)` their oracle values.
    beta (ARW) and zeta (CAR, from the proposals' probabilities) are weights, not differentiated."""
    beta = rejection_weights(kept, proposed)
    zeta = confidence_weights(proposal_log_probs.detach().exp(), temperature)
    total = kept.sum().clamp_min(1e-12)
    return -(kept * (kept_log_probs - beta * zeta * proposal_log_probs)).sum() / total
