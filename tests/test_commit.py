"""The commit plan, on made-up verdicts: which cache entries each model keeps after a step, and what the draft is fed
next. Offsets count from where the step started in each cache."""

from __future__ import annotations

import torch

from vlmspec.engine.commit import plan_commit

CPU = torch.device("cpu")
#: The accepted node at each depth from the root (entries past the accepted count are padding), and the step's
#: emitted tokens: the accepted draft tokens, then the bonus token, then padding.
PATH = torch.tensor([0, 3, 5, 9, 0])
TOKENS = torch.tensor([31, 51, 91, 77, 0])


def test_the_target_keeps_the_root_and_the_accepted_nodes():
    plan = plan_commit(PATH, 3, TOKENS, fed=1, cached_depth=3, slots=None, draft_device=CPU)
    assert plan.target.tolist() == [0, 3, 5, 9]


def test_the_draft_keeps_its_pending_tokens_and_the_accepted_nodes_it_was_fed():
    plan = plan_commit(PATH, 2, TOKENS, fed=2, cached_depth=3, slots=None, draft_device=CPU)
    # Node n was fed as the draft's (fed - 1 + n)-th token of the step: nodes 3 and 5 sit at 4 and 6.
    assert plan.draft.tolist() == [0, 1, 4, 6]
    assert plan.pending.tolist() == [91]


def test_accepted_nodes_deeper_than_the_draft_was_fed_are_fed_next_with_the_bonus_token():
    plan = plan_commit(PATH, 3, TOKENS, fed=1, cached_depth=1, slots=None, draft_device=CPU)
    assert plan.draft.tolist() == [0, 3]
    assert plan.pending.tolist() == [51, 91, 77]


def test_nothing_accepted_keeps_the_pending_tokens_and_feeds_the_bonus_token():
    plan = plan_commit(torch.tensor([0, 0, 0]), 0, torch.tensor([12, 0, 0]), 3, 2, None, CPU)
    assert plan.target.tolist() == [0]
    assert plan.draft.tolist() == [0, 1, 2]
    assert plan.pending.tolist() == [12]


def test_a_padded_plan_maps_nodes_to_the_slots_the_draft_fed_them_at():
    slots = torch.tensor([0, 1, 2, 4, 5, 8, 9, 10, 11, 12])
    plan = plan_commit(PATH, 3, TOKENS, fed=1, cached_depth=3, slots=slots, draft_device=CPU)
    assert plan.draft.tolist() == [0, 4, 8, 12]
    assert plan.target.tolist() == [0, 3, 5, 9]
