"""The commit plan, on made-up step reports: which cache entries each model keeps after a step, and what the draft is
fed next. Offsets count from where the step started in each cache."""

from __future__ import annotations

import torch

from vlmspec.engine.acceptance import StepReport
from vlmspec.engine.commit import plan_commit

CPU = torch.device("cpu")
#: The accepted node at each depth from the root, and the step's emitted tokens: the accepted draft tokens, then the
#: bonus token.
PATH = [0, 3, 5, 9]
TOKENS = [31, 51, 91, 77]


def alone(path: list[int], tokens: list[int], fed: int, cached_depth: int, slots: list[int] | None = None):
    """One sequence's commit (a batch of one): its target offsets, draft offsets and pending tokens as lists."""
    report = StepReport(len(path) - 1, len(tokens), False, False, 0, tokens, path, [])
    plan = plan_commit([report], [fed], [cached_depth], [slots], CPU)
    return [part.tolist() for part in plan.row(0)]


def test_the_target_keeps_the_root_and_the_accepted_nodes():
    target, _, _ = alone(PATH, TOKENS, fed=1, cached_depth=3)
    assert target == [0, 3, 5, 9]


def test_the_draft_keeps_its_pending_tokens_and_the_accepted_nodes_it_was_fed():
    _, draft, pending = alone(PATH[:3], [31, 51, 91], fed=2, cached_depth=3)
    # Node n was fed as the draft's (fed - 1 + n)-th token of the step: nodes 3 and 5 sit at 4 and 6.
    assert draft == [0, 1, 4, 6]
    assert pending == [91]


def test_accepted_nodes_deeper_than_the_draft_was_fed_are_fed_next_with_the_bonus_token():
    _, draft, pending = alone(PATH, TOKENS, fed=1, cached_depth=1)
    assert draft == [0, 3]
    assert pending == [51, 91, 77]


def test_nothing_accepted_keeps_the_pending_tokens_and_feeds_the_bonus_token():
    target, draft, pending = alone([0], [12], fed=3, cached_depth=2)
    assert target == [0]
    assert draft == [0, 1, 2]
    assert pending == [12]


def test_a_padded_plan_maps_nodes_to_the_slots_the_draft_fed_them_at():
    slots = [0, 1, 2, 4, 5, 8, 9, 10, 11, 12]
    target, draft, _ = alone(PATH, TOKENS, fed=1, cached_depth=3, slots=slots)
    assert draft == [0, 4, 8, 12]
    assert target == [0, 3, 5, 9]


def test_a_batchs_rows_are_padded_to_the_widest_and_counted():
    short = StepReport(0, 1, False, False, 0, [12], [0], [])
    long = StepReport(3, 4, False, False, 0, TOKENS, PATH, [])
    plan = plan_commit([short, long], [3, 1], [2, 3], [None, None], CPU)
    assert plan.target_counts == [1, 4] and plan.draft_counts == [3, 4] and plan.pending_counts == [1, 1]
    assert plan.target.shape == (2, 4) and plan.draft.shape == (2, 4) and plan.pending.shape == (2, 1)
