"""The training objectives as functions of made-up tensors: distillation's gradient, VSD's path validity against an
enumeration, its oracle, ARW's leave-one-out weights, CAR's confidence weights, the sign of the M-step's gradient."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from vlmspec.training.objectives import (
    confidence_weights,
    kd_loss,
    length_weights,
    log_path_validity,
    oracle,
    rejection_weights,
    vsd_loss,
)


def test_distillation_is_zero_at_the_target_and_its_gradient_is_q_minus_p():
    target = torch.softmax(torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 2.0]]), -1)
    assert float(kd_loss(target.log(), target)) == pytest.approx(0.0, abs=1e-6)
    logits = torch.tensor([[0.0, 1.0, 0.0], [2.0, -1.0, 0.0]], requires_grad=True)
    kd_loss(torch.log_softmax(logits, -1), target).backward()
    expected = (torch.softmax(logits, -1) - target) / 2  # averaged over the two positions
    torch.testing.assert_close(logits.grad, expected.detach())


def test_path_validity_equals_the_product_of_min_one_p_over_q_for_every_enumerated_path():
    """Two-token paths over three tokens, with made-up target and draft tables per (first token) context."""
    generator = torch.Generator().manual_seed(0)
    p_first, q_first = torch.rand(3, generator=generator).softmax(0), torch.rand(3, generator=generator).softmax(0)
    p_second, q_second = (
        torch.rand(3, 3, generator=generator).softmax(1),
        torch.rand(3, 3, generator=generator).softmax(1),
    )
    for a, b in itertools.product(range(3), repeat=2):
        target = torch.stack([p_first[a], p_second[a, b]]).log()
        draft = torch.stack([q_first[a], q_second[a, b]]).log()
        kappa_1 = min(1.0, float(p_first[a] / q_first[a]))
        kappa_2 = kappa_1 * min(1.0, float(p_second[a, b] / q_second[a, b]))
        got = log_path_validity(target, draft).exp()
        assert got.tolist() == pytest.approx([kappa_1, kappa_2], rel=1e-5)


def test_the_oracle_weighs_prefixes_at_least_as_valid_as_the_greedy_paths_by_their_length():
    weights = length_weights(3)
    assert weights.tolist() == pytest.approx([1.05, 1.05**2, 1.05**3])
    validity = torch.tensor([[-0.1, -0.5, -2.0], [-0.3, -0.3, -0.3]])
    greedy = torch.tensor([-0.2, -0.4, -0.4])
    expected = torch.tensor([[1.05, 0.0, 0.0], [0.0, 1.05**2, 1.05**3]])
    torch.testing.assert_close(oracle(validity, greedy, weights), expected)


def test_arw_is_the_leave_one_out_share_of_weighted_valid_proposals():
    kept = torch.tensor([[1.0, 2.0, 1.0, 0.0]])
    proposed = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    beta = rejection_weights(kept, proposed)
    # sample 0: others weigh 2 + 1 + 0, of which valid 1 (sample 2) -> 1/3; sample 1: (1 + 1) / 2; sample 2: 1 / 3;
    # sample 3: (1 + 1) / 4.
    torch.testing.assert_close(beta, torch.tensor([[1 / 3, 1.0, 1 / 3, 0.5]]))
    assert rejection_weights(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])).tolist() == [[0.0, 1.0]]


def test_car_weights_are_a_softmax_of_the_proposals_probabilities_over_the_samples():
    probs = torch.tensor([[0.5, 0.1, 0.1], [0.2, 0.2, 0.2]])
    zeta = confidence_weights(probs, temperature=0.2)
    torch.testing.assert_close(zeta.sum(-1), torch.ones(2))
    assert zeta[0, 0] > zeta[0, 1] == zeta[0, 2]
    assert float(zeta[0, 0]) == pytest.approx(math.exp(2.5) / (math.exp(2.5) + 2 * math.exp(0.5)), rel=1e-5)
    torch.testing.assert_close(zeta[1], torch.full((3,), 1 / 3))


def test_the_m_step_raises_the_kept_paths_likelihood_and_lowers_a_rejected_proposals():
    """Two tokens, one sample pair at one length: the kept path (the target's continuation, token 0) replaced a
    rejected proposal (token 1) beside a valid one, so beta > 0; a gradient step moves mass from token 1 to 0."""
    logits = torch.zeros(2, requires_grad=True)
    log_q = torch.log_softmax(logits, 0)
    kept_logs = log_q[[0, 0]][None]  # (L=1, S=2): both samples keep token 0 (one by correction)
    proposal_logs = log_q[[0, 1]][None]  # the proposals: token 0 (valid), token 1 (rejected)
    kept = torch.tensor([[1.0, 1.0]])
    proposed = torch.tensor([[1.0, 0.0]])
    vsd_loss(kept_logs, proposal_logs, kept, proposed).backward()
    assert logits.grad[0] < 0 < logits.grad[1]  # descending the loss raises logit 0 and lowers logit 1


def test_with_every_proposal_rejected_the_m_step_is_plain_likelihood_of_the_corrections():
    log_q = torch.log_softmax(torch.tensor([0.3, -0.2, 1.0]), 0)
    kept_logs = log_q[[2, 2]][None]
    proposal_logs = log_q[[0, 1]][None]
    loss = vsd_loss(kept_logs, proposal_logs, torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 0.0]]))
    assert float(loss) == pytest.approx(-float(log_q[2]))
