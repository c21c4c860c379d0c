"""Plain steps: where drafting does not pay, the default policy's rows take the target's next token alone (as
`generate` decodes it), probe the draft every few plain steps and draft again where it pays, the draft first catching
up on the tokens it missed. Whatever the rows switch to and when, the output is the target's own: greedy ids equal
`generate`'s, every row of a batch its own `generate`, samples follow the target's exact distribution.

A fixed cost ratio makes every decision deterministic (no clock): with a random draft (which almost never agrees)
rows draft, stop drafting, then probe every `interval` plain steps; with the target itself as the draft (every draft
token accepted) rows that start plain switch drafting on at their first probe and keep it.
"""

from __future__ import annotations

import re

import pytest
import torch
from sampling_cases import ALPHA, speculative_test
from test_batch import assert_rows_equal_their_own_generate, early_eos, padded_batch

from vlmspec import SpeculativeVLM
from vlmspec.policies import AutoPolicy
from vlmspec.policies.draft_gate import LAST_TOKEN, NOT_PAYING, DraftGateConfig

#: Rows draft twice (they expect 2 tokens a step against a ratio of 1.5), a random draft's steps emit one token, so
#: they switch drafting off, then probe every ceil((1.5 - 1) / 0.25) = 2 plain steps.
SWITCHING = DraftGateConfig(cost_ratio=1.5, loss=0.25, prior_tokens=2.0)
#: Rows expect one token a step, so they start plain; a draft that pays switches drafting on at the first probe.
STARTS_PLAIN = DraftGateConfig(cost_ratio=1.5, loss=0.25, prior_tokens=1.0)
#: No draft pays at this ratio: every row probes once every two plain steps and switches off again.
PROBING = DraftGateConfig(cost_ratio=8.0, loss=0.5, longest_run=2)
#: Samples per G test (drawn as one call's rows): the exact distributions are those of `test_sampling.py`.
DRAWS = 600
NEW = 32


class LoggedPolicy(AutoPolicy):
    """The default policy, keeping every step's per-row decisions: None where a row drafts, else why it does not."""

    def __init__(self, gate: DraftGateConfig):
        super().__init__(gate=gate)
        self.decisions: list[list[str | None]] = []

    def drafting(self, rows, sampling, rooms) -> list[str | None]:
        reasons = super().drafting(rows, sampling, rooms)
        self.decisions.append(list(reasons))
        return reasons


def gated(family, draft: str, gate: DraftGateConfig, **options) -> SpeculativeVLM:
    """A pair under the default policy whose gate decides by `gate`."""
    return SpeculativeVLM(family.target, family.drafts[draft], policy=LoggedPolicy(gate), **options)


LETTERS = {None: "D", NOT_PAYING: "P", LAST_TOKEN: "L"}


def pattern(steps) -> str:
    """A sequence's steps as letters: D drafted, P plain (drafts do not pay), L plain (one token left)."""
    return "".join(LETTERS[step.plain] for step in steps)


def batch_pattern(policy: LoggedPolicy) -> str:
    """The policy's steps so far as letters: D where some row drafted, else P."""
    return "".join("D" if None in reasons else "P" for reasons in policy.decisions)


def mixed_steps(policy: LoggedPolicy) -> int:
    """The policy's steps so far in which some rows drafted while others took plain steps as drafts do not pay."""
    return sum(None in reasons and NOT_PAYING in reasons for reasons in policy.decisions)


def new_tokens(out: torch.Tensor, inputs: dict) -> list[int]:
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def emitted_by_plain_steps(steps) -> list[int]:
    """The indices (among the new tokens) of the tokens that plain steps emitted; the prefill emits the first."""
    position, indices = 1, []
    for step in steps:
        if step.plain is not None:
            indices.append(position)
        position += step.accepted + 1
    return indices


@pytest.mark.parametrize("case", ["image", "video"])
def test_greedy_output_equals_generate_while_rows_switch_drafting_off_and_on_again(family, case):
    """A random draft: the rows draft, stop drafting, probe, stop again, mid-sequence; the ids are `generate`'s."""
    spec = gated(family, "independent", SWITCHING)
    out = spec.generate(**family.cases[case], max_new_tokens=NEW)
    assert torch.equal(out, family.reference(case, NEW))
    assert re.search("D+P+D+P", pattern(spec.last_stats.steps)), pattern(spec.last_stats.steps)


@pytest.mark.parametrize("case", ["image", "video"])
def test_greedy_output_equals_generate_when_a_draft_that_pays_is_switched_on_after_plain_steps(family, case):
    """The target as its own draft: the rows start plain, the first probe pays and drafting stays on."""
    spec = gated(family, "self", STARTS_PLAIN, pruning=None)
    out = spec.generate(**family.cases[case], max_new_tokens=NEW)
    assert torch.equal(out, family.reference(case, NEW))
    steps = pattern(spec.last_stats.steps)
    assert re.fullmatch("P+D+L?", steps), steps


def test_sampling_whose_warped_distribution_is_one_token_equals_generate_while_rows_switch(family):
    """Sampled, every family: with top-k 1 (as Qwen2.5-VL-Instruct's released config) the draw is the target's one
    token, so the ids equal `generate`'s through plain steps, probes and drafting steps alike."""
    sampling = dict(do_sample=True, top_k=1, temperature=0.7, repetition_penalty=1.05)
    spec = gated(family, "independent", SWITCHING)
    out = spec.generate(**family.cases["image"], max_new_tokens=NEW, **sampling)
    assert torch.equal(out, family.target.generate(**family.cases["image"], max_new_tokens=NEW, **sampling))
    assert re.search("D+P+D+P", pattern(spec.last_stats.steps)), pattern(spec.last_stats.steps)


@pytest.mark.parametrize("case", ["image", "two_images"])
def test_a_draft_that_catches_up_after_plain_steps_proposes_the_targets_own_tokens(family, case):
    """The target as its own draft, probed every two plain steps: each probe's draft has seen every token the plain
    steps emitted, so the target accepts its whole greedy path."""
    spec = gated(family, "self", PROBING, pruning=None)
    out = spec.generate(**family.cases[case], max_new_tokens=NEW)
    assert torch.equal(out, family.reference(case, NEW))
    steps = spec.last_stats.steps
    assert re.search("PPDPPD", pattern(steps)), pattern(steps)
    drafted = [step for step in steps if step.plain is None]
    assert all(step.accepted == step.greedy_depth for step in drafted)
    assert sum(step.accepted for step in drafted) > len(drafted)


def test_rows_of_a_batch_catch_up_on_the_tokens_each_missed_and_propose_the_targets_own_tokens(family):
    """The target as its own draft, two rows in flight (the third prompt joins when the first finishes), probed
    every two plain steps: every row is its own `generate`, and every drafting step accepts its whole chain."""
    budgets = {"image": 12, "two_images": 24, "text": 24}
    spec = gated(family, "self", PROBING, pruning=None)
    items = [(case, family.cases[case], {"max_new_tokens": n}) for case, n in budgets.items()]
    results = {r.key: r for r in spec.stream(items, batch_size=2, do_sample=False)}
    for case, result in results.items():
        assert torch.equal(result.sequence, family.reference(case, budgets[case])), case
        drafted = [step for step in result.stats.steps if step.plain is None]
        assert drafted and all(step.accepted == step.greedy_depth for step in drafted), case
    assert re.search("PPDPPD", batch_pattern(spec.policy)), batch_pattern(spec.policy)


def test_every_row_of_a_padded_batch_equals_its_own_generate_while_the_rows_switch(family):
    rows = ("text", "image", "video", "long_prompt")
    batch = padded_batch(family, rows)
    eos = early_eos(family)
    spec = gated(family, "independent", SWITCHING)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=24, eos_token_id=eos)
    assert torch.equal(out, family.target.generate(**batch, do_sample=False, max_new_tokens=24, eos_token_id=eos))
    assert_rows_equal_their_own_generate(family, batch, out, rows, eos_token_id=eos)
    assert re.search("D+P+D+P", batch_pattern(spec.policy)), batch_pattern(spec.policy)


def mixed_batch(family, spec: SpeculativeVLM, greedy: dict[str, int]) -> dict:
    """Greedy prompts (case: budget) decoded together with two seeded sampled ones; each prompt's `RowResult`."""
    sampling = dict(do_sample=True, temperature=1.3, top_k=0, max_new_tokens=24)
    items = [(("greedy", case), family.cpu_cases[case], {"max_new_tokens": n}) for case, n in greedy.items()]
    items += [
        (("sampled", case), family.cpu_cases[case], {**sampling, "generator": torch.Generator().manual_seed(seed)})
        for seed, case in enumerate(("image", "video"))
    ]
    return {r.key: r for r in spec.stream(items, batch_size=len(items), do_sample=False)}


def test_in_steps_where_some_rows_draft_and_others_do_not_every_greedy_row_equals_its_own_generate(qwen):
    """Greedy rows decide together, sampled rows each alone: in some steps some rows draft while others take plain
    steps."""
    greedy = {"image": 24, "video": 20}
    spec = gated(qwen, "noisy", SWITCHING)
    results = mixed_batch(qwen, spec, greedy)
    for case, budget in greedy.items():
        expected = qwen.target.generate(**qwen.cases[case], do_sample=False, max_new_tokens=budget)
        assert torch.equal(results["greedy", case].sequence, expected), case
    assert mixed_steps(spec.policy) > 0, spec.policy.decisions


def test_a_sampled_rows_draws_do_not_depend_on_when_the_other_rows_draft(qwen):
    """A seeded sampled row decides from its own steps only: beside other greedy rows, whose steps switch at other
    times, it takes the same steps and draws the same tokens (at the same batch size)."""
    runs = [
        mixed_batch(qwen, gated(qwen, "noisy", SWITCHING), greedy)
        for greedy in ({"image": 24, "video": 20}, {"text": 24, "long_prompt": 12})
    ]
    greedy = [[pattern(r.stats.steps) for key, r in run.items() if key[0] == "greedy"] for run in runs]
    assert greedy[0] != greedy[1]
    for case in ("image", "video"):
        first, second = (run["sampled", case] for run in runs)
        assert torch.equal(first.sequence, second.sequence), case
        assert pattern(first.stats.steps) == pattern(second.stats.steps), case
        assert "D" in pattern(first.stats.steps) and "P" in pattern(first.stats.steps), case


def sampled_g_test(draft: str, gate: DraftGateConfig, case: str, warp: str) -> LoggedPolicy:
    """DRAWS continuations of NEW_TOKENS tokens drawn as one call's rows, each row deciding by its own steps, pass a
    G test against the target's exact distribution; returns the policy, which logged the steps."""
    policy = LoggedPolicy(gate)
    result, _ = speculative_test(policy, draft, case, warp, DRAWS)
    assert result.samples == DRAWS and result.impossible == 0
    assert result.passes(ALPHA), result
    return policy


def test_samples_follow_the_targets_exact_distribution_while_rows_switch_drafting_off_and_on():
    """A partly agreeing draft: every row drafts first, then rows whose drafts were rejected take plain steps beside
    rows that draft, and probe."""
    gate = DraftGateConfig(cost_ratio=1.5, loss=0.25, prior_tokens=1.6)
    policy = sampled_g_test("noisy", gate, "video", "top_k_top_p")
    assert set(policy.decisions[0]) == {None} and mixed_steps(policy) > 0, policy.decisions


def test_samples_follow_the_targets_exact_distribution_when_a_draft_that_pays_is_switched_on():
    policy = sampled_g_test("self", STARTS_PLAIN, "text", "temperature")
    assert re.match("P+D", batch_pattern(policy)), policy.decisions


def test_the_same_seed_draws_the_same_samples_while_rows_switch(qwen):
    spec = gated(qwen, "independent", SWITCHING)
    inputs = qwen.cases["image"]

    def sample(seed: int) -> tuple[torch.Tensor, str]:
        generator = torch.Generator().manual_seed(seed)
        out = spec.generate(**inputs, do_sample=True, temperature=1.5, max_new_tokens=24, generator=generator)
        return out, pattern(spec.last_stats.steps)

    (first, steps), (again, steps_again) = sample(3), sample(3)
    assert torch.equal(first, again) and steps == steps_again
    assert not torch.equal(first, sample(4)[0])
    assert re.search("D+P+D", steps), steps


def test_an_eos_emitted_by_a_plain_step_ends_decoding_where_generate_ends_it(family):
    inputs = family.cases["image"]
    spec = gated(family, "independent", SWITCHING)
    tokens = new_tokens(spec.generate(**inputs, max_new_tokens=NEW), inputs)
    plain = emitted_by_plain_steps(spec.last_stats.steps)
    at = next(i for i in plain[2:] if tokens[i] not in tokens[:i])
    spec = gated(family, "independent", SWITCHING)
    out = spec.generate(**inputs, max_new_tokens=NEW, eos_token_id=tokens[at])
    expected = family.target.generate(**inputs, do_sample=False, max_new_tokens=NEW, eos_token_id=tokens[at])
    assert torch.equal(out, expected)
    assert len(new_tokens(out, inputs)) == at + 1
    assert spec.last_stats.steps[-1].plain == NOT_PAYING


def test_a_stop_string_completed_by_a_plain_step_ends_decoding_where_generate_ends_it(qwen):
    inputs, tokenizer = qwen.cases["image"], qwen.processor.tokenizer
    spec = gated(qwen, "independent", SWITCHING)
    tokens = new_tokens(spec.generate(**inputs, max_new_tokens=NEW), inputs)
    plain = emitted_by_plain_steps(spec.last_stats.steps)

    def printable(i: int) -> bool:
        text = tokenizer.decode(tokens[i : i + 1])
        return text.isascii() and any(c.isalnum() for c in text) and "<|" not in text

    at = next(i for i in plain[2:] if printable(i) and tokens[i] not in tokens[:i])
    kwargs = dict(max_new_tokens=NEW, stop_strings=[tokenizer.decode(tokens[at - 1 : at + 1])], tokenizer=tokenizer)
    expected = qwen.target.generate(**inputs, do_sample=False, **kwargs)
    spec = gated(qwen, "independent", SWITCHING)
    out = spec.generate(**inputs, **kwargs)
    assert torch.equal(out, expected)
    assert len(new_tokens(out, inputs)) == at + 1
    assert spec.last_stats.steps[-1].plain == NOT_PAYING


def test_the_budgets_last_token_is_a_plain_step_and_decoding_ends_where_generate_ends(qwen):
    """With one token left no draft token could be emitted: the step is plain, and decoding ends where `generate`
    ends."""
    spec = gated(qwen, "self", STARTS_PLAIN, pruning=None)
    for budget in (3, 24):
        out = spec.generate(**qwen.cases["video"], max_new_tokens=budget)
        assert torch.equal(out, qwen.reference("video", budget))
        assert pattern(spec.last_stats.steps)[-1] == "L", budget


def test_statistics_count_plain_steps_by_why_and_tau_over_drafting_steps_only(qwen):
    spec = gated(qwen, "self", STARTS_PLAIN, pruning=None)
    out = spec.generate(**qwen.cases["video"], max_new_tokens=NEW)
    stats = spec.last_stats
    steps = pattern(stats.steps)
    assert re.fullmatch("P+D+L", steps), steps
    assert stats.plain_steps == steps.count("P") + steps.count("L") == sum(s.plain is not None for s in stats.steps)
    assert stats.plain_reasons == {NOT_PAYING: steps.count("P"), LAST_TOKEN: steps.count("L")}
    plain = [s for s in stats.steps if s.plain is not None]
    assert all(s.accepted == 0 and s.nodes == 0 for s in plain)
    drafted = [s.accepted for s in stats.steps if s.plain is None]
    assert stats.mean_accept_length == pytest.approx(sum(drafted) / len(drafted))
    assert stats.mean_accept_length > sum(drafted) / len(stats.steps)
    assert stats.iterations == len(stats.steps)
    assert stats.new_tokens == out.shape[1] - qwen.cases["video"]["input_ids"].shape[1]
    assert stats.new_tokens == 1 + sum(s.accepted + 1 for s in stats.steps)


def test_a_batchs_statistics_count_every_rows_plain_steps(qwen):
    rows = ("image", "video", "text")
    spec = gated(qwen, "independent", SWITCHING)
    spec.generate(**padded_batch(qwen, rows), do_sample=False, max_new_tokens=24)
    stats = spec.last_stats
    assert stats.plain_steps == sum(s.plain is not None for s in stats.steps) > 0
    assert sum(stats.plain_reasons.values()) == stats.plain_steps
    assert stats.plain_reasons[NOT_PAYING] > 0 and stats.plain_steps < len(stats.steps)
    assert stats.new_tokens == len(rows) + sum(s.accepted + 1 for s in stats.steps)
