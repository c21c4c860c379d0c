"""Whether a row drafts at all: drafting pays while a drafting step's expected tokens exceed its cost against a plain
step, and a row that stops probes on an interval that bounds what probing costs (no model: made-up steps)."""

from __future__ import annotations

import math

import pytest
import torch
from policy_steps import chain_step

from vlmspec.policies import AutoPolicy, BatchShape
from vlmspec.policies.draft_gate import (
    LAST_TOKEN,
    NOT_PAYING,
    TIMING,
    DraftGateConfig,
    RowGate,
    StepCosts,
    choose_drafting,
)


def timed(drafting: float, plain: float, rows: int = 1, config: DraftGateConfig | None = None) -> StepCosts:
    """Step costs that have timed drafting steps and plain steps of `rows` rows (two of each: the first of a kind at a
    batch size is taken as a warm-up)."""
    costs = StepCosts(config or DraftGateConfig())
    for _ in range(2):
        costs.observe(rows, drafting, drafted=True)
        costs.observe(rows, plain, drafted=False)
    return costs


def gate(costs: StepCosts, tokens: float | None = None) -> RowGate:
    """A row whose drafting steps have emitted `tokens` a step (memory 1: its mean is its last step), or a new row."""
    row = RowGate(costs)
    if tokens is not None:
        row.observe(tokens, rows=1, samples=False)
    return row


EXACT = DraftGateConfig(memory=1.0)


@pytest.mark.parametrize("ratio, expected", [(1.0, 1), (1.001, 1), (1.5, 25), (2.0, 50), (2.2, 60), (3.0, 60)])
def test_the_probe_interval_is_ceil_of_ratio_less_one_over_loss_from_1_to_longest_run(ratio, expected):
    """At least one plain step between probes, at most `longest_run`."""
    config = DraftGateConfig(loss=0.02, longest_run=60)
    assert config.interval(ratio) == expected == min(60, max(1, math.ceil((ratio - 1) / 0.02)))


@pytest.mark.parametrize("loss", [0.005, 0.02, 0.1, 0.3])
@pytest.mark.parametrize("ratio", [1.01, 1.06, 1.5, 2.0, 3.7, 10.0])
def test_probing_at_the_interval_costs_at_most_loss_of_plain_decodings_time(loss, ratio):
    """K plain steps then a probe (c plain steps' time, one token at least), against plain decoding of as many
    tokens."""
    config = DraftGateConfig(loss=loss, longest_run=10**6)
    k = config.interval(ratio)
    probing, plain = k + ratio, k + 1
    assert ratio - 1 <= loss * k * (1 + 1e-12)
    assert probing <= (1 + loss) * plain


@pytest.mark.parametrize(
    "fields",
    [
        {"loss": 0.0},
        {"loss": 1.0},
        {"loss": -0.1},
        {"memory": 0.0},
        {"prior_ratio": 0.9},
        {"untimed_ratio": 0.5},
        {"cost_ratio": 0.99},
        {"prior_tokens": 0.5},
        {"longest_run": 0},
    ],
)
def test_a_config_outside_its_bounds_is_refused(fields):
    """A step emits one token at least, so no ratio or prior is below 1; loss and memory are shares."""
    with pytest.raises(ValueError):
        DraftGateConfig(**fields)


def test_the_ratio_is_the_prior_until_both_kinds_of_step_are_timed():
    """Timing only one kind of step, or the two at different batch sizes, is not a ratio."""
    costs = StepCosts(DraftGateConfig(prior_ratio=1.7))
    assert costs.ratio(1) == costs.ratio(8) == 1.7
    costs.observe(4, 3.0, drafted=True)
    costs.observe(2, 1.0, drafted=False)
    assert costs.ratio(4) == costs.ratio(2) == 1.7


def test_the_ratio_is_the_prior_while_only_the_first_drafting_step_is_timed():
    """The first drafting step at a batch size is its warm-up: a slow one alone must not stop every later step from
    drafting (and so from timing a second)."""
    costs = StepCosts(DraftGateConfig(prior_ratio=1.7))
    costs.observe(1, 1.0, drafted=False)
    costs.observe(1, 1.0, drafted=False)
    costs.observe(1, 50.0, drafted=True)
    assert costs.ratio(1) == 1.7
    costs.observe(1, 2.0, drafted=True)
    assert costs.ratio(1) == pytest.approx(2.0)


def test_the_ratio_is_of_the_median_recent_step_times():
    """Each kind of step's time is the median of its last `window` steps at the batch size: one slow step (a cache
    growing, the machine busy) does not move it, a lasting change does."""
    costs = timed(2.0, 1.0, rows=4, config=DraftGateConfig(window=5))
    for seconds in (1.0, 1.0, 100.0):
        costs.observe(4, seconds, drafted=False)
    assert costs.ratio(4) == pytest.approx(2.0)
    for _ in range(3):
        costs.observe(4, 4.0, drafted=True)
    assert costs.ratio(4) == pytest.approx(4.0)


def test_an_untimed_batch_size_takes_the_nearest_timed_ones_ratio():
    """Nearest by the log of the batch size."""
    costs = timed(2.0, 1.0, rows=1)
    for _ in range(2):
        costs.observe(16, 3.0, drafted=True)
        costs.observe(16, 1.0, drafted=False)
    assert costs.ratio(2) == costs.ratio(4) == pytest.approx(2.0)  # 4 is as near 1 as 16: the smaller wins
    assert costs.ratio(8) == costs.ratio(64) == pytest.approx(3.0)


def test_a_fixed_cost_ratio_overrides_the_measured_one_and_no_ratio_is_below_one():
    """A drafting step measured faster than a plain one counts as costing the same."""
    assert timed(5.0, 1.0, config=DraftGateConfig(cost_ratio=1.2)).ratio(1) == 1.2
    assert timed(0.5, 1.0).ratio(1) == 1.0


def test_a_greedy_row_drafts_while_its_tokens_exceed_the_ratio_and_stops_below_it():
    """At a measured ratio of 2: three tokens a step pay, one does not."""
    costs = timed(2.0, 1.0, config=EXACT)
    assert choose_drafting([gate(costs, 3)], [False], [10]) == [None]
    assert choose_drafting([gate(costs, 1)], [False], [10]) == [NOT_PAYING]


def test_a_row_that_stopped_probes_after_interval_plain_steps():
    """The probe is due on the `interval`-th plain step, not before."""
    costs = timed(2.0, 1.0, config=EXACT)
    row = gate(costs, 1)
    for _ in range(EXACT.interval(2.0) - 1):
        row.skipped()
    assert choose_drafting([row], [False], [10]) == [NOT_PAYING]
    row.skipped()
    assert choose_drafting([row], [False], [10]) == [None]


def test_a_probe_that_emits_many_tokens_turns_drafting_back_on():
    """The probe's tokens lift the row's running mean past the ratio."""
    costs = timed(2.0, 1.0)
    row = RowGate(costs)
    for _ in range(10):
        row.observe(1, rows=1, samples=False)
    assert row.expected_tokens(samples=False) < 2.0 and choose_drafting([row], [False], [10]) == [NOT_PAYING]
    row.observe(6, rows=1, samples=False)
    assert row.expected_tokens(samples=False) > 2.0 and row.since == 0
    assert choose_drafting([row], [False], [10]) == [None]


def test_a_row_with_one_token_left_never_drafts():
    """Greedy or sampled, however well its drafts pay."""
    costs = timed(2.0, 1.0, rows=2, config=EXACT)
    assert choose_drafting([gate(costs, 5), gate(costs, 5)], [False, True], [1, 0]) == [LAST_TOKEN] * 2
    assert choose_drafting([gate(costs, 5), gate(costs, 5)], [False, False], [10, 1]) == [None, LAST_TOKEN]


def test_a_batch_size_never_timed_runs_two_plain_steps_to_time_it():
    """Before plain steps of its size were timed, a greedy batch runs two (the first a warm-up: the ratio is then
    measured, not assumed); rows that sample and want to draft are not held back for it, and a fixed ratio needs no
    timing."""
    costs = timed(2.0, 1.0, rows=1, config=EXACT)
    for _ in range(2):
        assert choose_drafting([gate(costs, 5), gate(costs, 5)], [False, False], [10, 10]) == [TIMING] * 2
        assert choose_drafting([gate(costs, 5), gate(costs, 5)], [False, True], [10, 10]) == [None, None]
        costs.observe(2, 1.0, drafted=False)
    assert choose_drafting([gate(costs, 5), gate(costs, 5)], [False, False], [10, 10]) == [None, None]
    fixed = StepCosts(DraftGateConfig(cost_ratio=2.0, memory=1.0))
    assert choose_drafting([gate(fixed, 5)], [False], [10]) == [None]


def test_greedy_rows_decide_together_by_their_mean_tokens():
    """A batch verifies every row, so one row's good draft can carry a poor one, or not."""
    costs = timed(2.0, 1.0, rows=2, config=EXACT)
    assert choose_drafting([gate(costs, 1), gate(costs, 4)], [False, False], [10, 10]) == [None, None]
    assert choose_drafting([gate(costs, 1), gate(costs, 2.5)], [False, False], [10, 10]) == [NOT_PAYING] * 2


def test_a_new_sampled_row_drafts_on_the_fixed_prior_not_the_pairs_recent_rows():
    """The pair's recent rows say drafts do not pay; a greedy row follows them, a sampled one does not."""
    costs = timed(2.0, 1.0, config=EXACT)
    gate(costs, 1)  # the pair's last row emitted one token a step
    assert costs.tokens == 1
    assert choose_drafting([gate(costs)], [False], [10]) == [NOT_PAYING]
    assert choose_drafting([gate(costs)], [True], [10]) == [None]


@pytest.mark.parametrize("tokens, sampled", [(1.2, NOT_PAYING), (1.8, None)])
def test_measured_times_move_greedy_rows_but_not_sampled_ones(tokens, sampled):
    """A sampled row compares its tokens with `untimed_ratio` (1.5) whatever the clock says."""
    for drafting, greedy in [(1.1, None), (3.0, NOT_PAYING)]:
        costs = timed(drafting, 1.0, config=EXACT)
        assert choose_drafting([gate(costs, tokens)], [False], [10]) == [greedy]
        assert choose_drafting([gate(costs, tokens)], [True], [10]) == [sampled]


def test_once_any_row_drafts_every_greedy_row_with_room_drafts_too():
    """The step costs a drafting step's time anyway; sampled rows still decide alone."""
    costs = timed(3.0, 1.0, rows=4, config=EXACT)
    rows = [gate(costs), gate(costs, 1), gate(costs, 1), gate(costs, 1)]
    reasons = choose_drafting(rows, [True, False, False, True], [10, 10, 1, 10])
    assert reasons == [None, None, LAST_TOKEN, NOT_PAYING]  # the sampled row that does not pay still decides alone


def test_a_new_greedy_row_starts_from_the_pairs_recent_rows_a_sampled_one_from_the_prior():
    """And a sampled row's drafting steps teach the pair nothing."""
    costs = StepCosts(DraftGateConfig(prior_tokens=4.0))
    old = RowGate(costs)
    for _ in range(20):
        old.observe(1, rows=1, samples=False)
    assert costs.tokens == pytest.approx(1.0, abs=0.01)
    assert RowGate(costs).expected_tokens(samples=False) == costs.tokens
    sampler = RowGate(costs)
    assert sampler.expected_tokens(samples=True) == 4.0
    sampler.observe(1, rows=1, samples=True)  # a sampled row's steps do not teach the pair
    assert costs.tokens == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("sampled, teaches", [(False, True), (True, False)])
def test_a_rows_drafting_step_teaches_the_pair_only_when_the_row_is_greedy(sampled, teaches):
    """The step says whether its row samples (`StepOutcome.sampled`): a greedy row's tokens move what a new row
    expects, a sampled row's do not."""
    policy = AutoPolicy(gate=DraftGateConfig(prior_tokens=4.0))
    step = chain_step(torch.zeros(10).log_softmax(-1), accepted=0)
    step.sampled = sampled
    policy.for_row().observe(step)
    assert (policy.costs.tokens < 4.0) == teaches


def test_a_policys_rows_share_its_step_costs_but_each_has_its_own_gate():
    """Resetting a row gives it a fresh gate over the same costs."""
    policy = AutoPolicy()
    rows = [policy.for_row() for _ in range(3)]
    assert all(row.costs is policy.costs for row in rows)
    assert len({id(row.gate) for row in rows} | {id(policy.gate)}) == 4
    rows[0].reset()
    assert rows[0].costs is policy.costs and rows[0].gate.costs is policy.costs


def test_a_plain_step_is_timed_and_counted_in_every_row():
    """`observe_plain` times the step at the batch's size and counts a skipped step per row."""
    policy = AutoPolicy()
    rows = [policy.for_row() for _ in range(3)]
    policy.observe_plain(rows, [NOT_PAYING] * 3, 0.5)
    policy.observe_plain(rows, [NOT_PAYING] * 3, 0.5)
    assert policy.costs.plain == {3: 0.5}
    assert [row.gate.since for row in rows] == [2, 2, 2]


def test_a_draft_that_never_agrees_decodes_within_loss_of_plain_decodings_time():
    """Drafting steps take 2 s, plain ones 1 s, and every step emits one token: after a few drafting steps to learn
    that, the policy runs plain, probing every `interval(2)` plain steps, and loses at most `loss` to probing."""
    config = DraftGateConfig(loss=0.02)
    policy = AutoPolicy(gate=config)
    row = policy.for_row()
    log_probs = torch.zeros(10).log_softmax(-1)
    kinds = []
    for _ in range(300):
        reasons = policy.drafting([row], [False], [1000])
        if reasons == [None]:
            step = chain_step(log_probs, accepted=0, draft_seconds=1.0, verify_seconds=1.0)
            step.batch = BatchShape(1, 2, 1, 1, 1, 100, 100, first=True)
            row.observe(step)
        else:
            assert reasons == ([TIMING] if len(kinds) < 2 else [NOT_PAYING])
            policy.observe_plain([row], reasons, 1.0)
        kinds.append("draft" if reasons == [None] else "timing" if reasons == [TIMING] else "plain")
    assert kinds[:2] == ["timing", "timing"]
    warmup = kinds.index("plain")
    assert warmup <= 5
    probes = [i for i, kind in enumerate(kinds) if kind == "draft" and i > warmup]
    interval = config.interval(2.0)
    gaps = [b - a for a, b in zip([warmup - 1, *probes[:-1]], probes, strict=True)]
    assert interval == 50 and len(probes) >= 5 and gaps == [interval + 1] * len(probes)
    seconds = sum(2.0 if kind == "draft" else 1.0 for kind in kinds)
    assert seconds - 2.0 * warmup <= (1 + config.loss) * (300 - warmup) * 1.0
    assert seconds <= (1 + config.loss) * 300 * 1.0 + warmup * (2.0 - 1.0)


def test_a_slow_first_step_at_a_batch_size_is_taken_as_a_warm_up():
    """The first step of a kind at a batch size runs shapes the process has not run before: it is dropped once a
    second has run."""
    costs = StepCosts(DraftGateConfig())
    costs.observe(4, 10.0, drafted=False)
    assert costs.plain[4] == 10.0
    costs.observe(4, 1.0, drafted=False)
    costs.observe(4, 9.0, drafted=True)
    costs.observe(4, 2.0, drafted=True)
    assert costs.ratio(4) == pytest.approx(2.0)
    costs.observe(4, 3.0, drafted=False)
    assert costs.plain[4] == pytest.approx(2.0)


def test_while_rows_draft_plain_steps_are_timed_again_ever_more_rarely():
    """A plain time taken while the machine was busy must not keep rows drafting for good: after 4, 8, 16, ...
    drafting steps (then every `retime`), a greedy batch runs a plain step to time it again."""
    costs = timed(2.0, 1.0, config=DraftGateConfig(retime=16))
    gaps = []
    for _ in range(6):
        drafted = 0
        while choose_drafting([gate(costs, 5)], [False], [100]) == [None]:
            costs.observe(1, 2.0, drafted=True)
            drafted += 1
        assert choose_drafting([gate(costs, 5)], [False], [100]) == [TIMING]
        costs.observe(1, 1.0, drafted=False)
        gaps.append(drafted)
    assert gaps == [4, 8, 16, 16, 16, 16]
    assert not StepCosts(DraftGateConfig(cost_ratio=2.0)).untimed(1)
