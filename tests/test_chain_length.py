"""The default's chain length for a batch: the length with the most expected tokens per expected second, from the
steps' measured times and the rows' acceptances (no model: made-up steps)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from vlmspec.policies import ChainLength, ChainLengthConfig


def fitted(
    seconds, accepted: Sequence[int] = (8, 2, 5, 0), rows: int = 32, config: ChainLengthConfig | None = None
) -> ChainLength:
    """A chooser past its warm-up that has seen steps of `rows` (and half as many) rows at every length, timed by
    `seconds(rows, k)`, and rows that accepted `accepted[i]` tokens of 8, in turns."""
    chooser = ChainLength(config)
    for _ in range(4):
        for k in range(1, chooser.config.longest + 1):
            chooser.observe_step(rows, k, seconds(rows, k))
            chooser.observe_step(rows // 2, k, seconds(rows // 2, k))
    for i in range(3000):
        chooser.observe_row(accepted=accepted[i % len(accepted)], drafted=8, rows=rows)
    return chooser


def best_by_hand(chooser: ChainLength, seconds, rows: int) -> int:
    lengths = range(1, chooser.config.longest + 1)
    return max(lengths, key=lambda k: chooser.expected_tokens(k) / seconds(rows, k))


@pytest.mark.parametrize("accepted, expected", [(5, [2, 3, 4, 5, 6]), (0, [1, 1, 1, 1, 1])])
def test_a_chain_emits_its_accepted_run_and_the_targets_next_token(accepted, expected):
    chooser = ChainLength()
    for _ in range(3000):
        chooser.observe_row(accepted=accepted, drafted=5, rows=4)
    assert [chooser.expected_tokens(k) for k in range(1, 6)] == pytest.approx(expected, abs=0.01)


def test_rows_that_accept_whole_chains_or_none_value_deep_tokens_as_they_are_accepted():
    chooser = ChainLength()
    for _ in range(3000):
        chooser.observe_row(accepted=5, drafted=5, rows=4)
        chooser.observe_row(accepted=0, drafted=5, rows=4)
    rates = chooser.rates()
    assert rates[0] == pytest.approx(0.5, abs=0.01) and rates[1:5] == pytest.approx([1.0] * 4, abs=0.01)
    assert chooser.expected_tokens(5) == pytest.approx(1 + 0.5 * 5, abs=0.05)


def test_depths_past_a_rejection_are_not_counted_as_tried():
    chooser = ChainLength()
    before = chooser.rates()
    for _ in range(3000):
        chooser.observe_row(accepted=1, drafted=5, rows=4)
    assert chooser.rates()[:2] == pytest.approx([1.0, 0.0], abs=0.01)
    assert chooser.rates()[2:] == pytest.approx(before[2:])


def test_the_first_steps_cycle_through_the_warmup_lengths():
    chooser = ChainLength(ChainLengthConfig(warmup=(5, 2, 7)))
    chosen = []
    for _ in range(3):
        chosen.append(chooser.choose(8))
        chooser.observe_step(8, chosen[-1], 0.1)
    assert chosen == [5, 2, 7]


def test_compute_bound_verification_gets_short_chains():
    def seconds(rows, k):  # every verified token costs: a CPU, a full batch
        return 0.004 + 0.0015 * rows * (k + 1) + 0.0004 * rows * k

    chooser = fitted(seconds, accepted=(3, 1, 6))
    assert chooser.best(32) == best_by_hand(chooser, seconds, 32)
    assert chooser.best(32) < chooser.config.default


def test_verification_that_costs_the_same_for_more_tokens_gets_long_chains():
    def seconds(rows, k):  # an accelerator, a few rows: the forward's fixed cost dominates
        return 0.020 + 0.001 * k + 0.00001 * rows * k

    chooser = fitted(seconds, rows=4)
    assert chooser.best(4) == chooser.config.longest


def test_a_draft_the_target_rarely_agrees_with_drafts_one_token():
    def seconds(rows, k):
        return 0.01 + 0.0005 * rows * k

    assert fitted(seconds, accepted=(0,)).best(32) == 1


def test_every_few_steps_a_neighbour_of_the_best_or_the_longest_is_tried_in_turn():
    def seconds(rows, k):
        return 0.03 + 0.001 * rows * (k + 1)

    chooser = fitted(seconds, config=ChainLengthConfig(explore_every=4))
    best = chooser.best(32)
    assert 1 < best < chooser.config.longest
    chosen = [chooser.choose(32) for _ in range(12)]
    longest = chooser.config.longest
    assert chosen == [best] * 3 + [best + 1] + [best] * 3 + [best - 1] + [best] * 3 + [longest]


def test_plans_that_may_not_follow_a_clock_draft_the_default():
    chooser = fitted(lambda rows, k: 0.004 + 0.0015 * rows * (k + 1))
    assert chooser.choose(32, timed=False) == chooser.config.default


def test_the_acceptance_rates_follow_what_the_rows_accept_lately():
    chooser = ChainLength()
    for _ in range(500):
        chooser.observe_row(accepted=5, drafted=5, rows=4)
    assert min(chooser.rates()[:5]) > 0.95
    for _ in range(2000):
        chooser.observe_row(accepted=0, drafted=5, rows=4)
    assert chooser.rates()[0] < 0.05


def test_a_fit_that_is_not_positive_keeps_the_default():
    chooser = ChainLength()
    for k in range(1, 7):
        chooser.observe_step(8, k, 0.0)
    assert chooser.best(8) == chooser.config.default


@pytest.mark.parametrize(
    "settings",
    [dict(default=0), dict(default=9), dict(warmup=()), dict(warmup=(0,)), dict(explore_every=0), dict(prior=1.0)],
)
def test_settings_out_of_range_are_refused(settings):
    with pytest.raises(ValueError):
        ChainLengthConfig(**settings)
