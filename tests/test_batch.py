"""Many sequences at once: every row of a batch decodes exactly as its own batch-size-1 `generate`, and as the
target's own batched `generate` on the same padded batch, for every family, policy and kind of input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import FAMILIES, on_device

from vlmspec import (
    AutoPolicy,
    ChainLengthConfig,
    DraftGateConfig,
    MemoryBudgetError,
    SageConfig,
    SageGtConfig,
    SpeculativeVLM,
)
from vlmspec.adapters import adapter_for
from vlmspec.policies import AdaptiveTreePlan, RankTreePlan, StepLesson, StepOutcome, TreePlan, TreePolicy

#: Rows of different prompt lengths: text, an image, a video and a long prompt.
ROWS = ("text", "image", "video", "long_prompt")
NEW_TOKENS = 24


def padded_batch(family, cases=ROWS) -> dict:
    """The left-padded batch of `cases`, as the family's processor makes it for a list of prompts."""
    adapter = adapter_for(family.target)
    rows = [family.cpu_cases[c] for c in cases]
    return on_device(adapter.join_rows(rows, family.processor.tokenizer.pad_token_id))


def early_eos(family, case: str = "image", at: int = 5) -> int:
    """A token the target emits `at` tokens into `case`'s continuation: as EOS it stops that row early."""
    reference = family.reference(case, NEW_TOKENS)
    return int(reference[0, family.cases[case]["input_ids"].shape[1] + at])


def assert_rows_equal_their_own_generate(family, batch: dict, out: torch.Tensor, cases, **kwargs) -> None:
    """Each row of `out` is its prompt's own batch-1 `generate`, left-padded as in `batch`, then padded after EOS."""
    pad = family.target.generation_config.pad_token_id
    width = batch["input_ids"].shape[1]
    for b, case in enumerate(cases):
        alone = family.target.generate(**family.cases[case], do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)
        prompt = family.cases[case]["input_ids"].shape[1]
        row = out[b, width - prompt :]
        assert torch.equal(row[: alone.shape[1]], alone[0]), case
        if pad is not None:
            assert bool((row[alone.shape[1] :] == pad).all()), case


def test_every_row_of_a_padded_batch_equals_its_own_generate_and_the_targets_batched_generate(family):
    batch = padded_batch(family)
    eos = early_eos(family)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], processor=family.processor)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    batched = family.target.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    assert torch.equal(out, batched)
    assert_rows_equal_their_own_generate(family, batch, out, ROWS, eos_token_id=eos)


@pytest.mark.parametrize("policy", ["auto", "chain", "static-tree", "sage", "sage-gt"])
@pytest.mark.parametrize("pruning", ["verifier", None])
def test_every_policy_decodes_a_padded_batch_exactly(policy, pruning):
    family = FAMILIES["qwen2_5_vl"]
    cases = ("two_images", "video", "text")
    batch = padded_batch(family, cases)
    spec = SpeculativeVLM(family.target, family.drafts["independent"], policy, pruning=pruning)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert_rows_equal_their_own_generate(family, batch, out, cases)


def test_the_defaults_chains_change_length_from_step_to_step_and_every_row_stays_exact(family):
    cases = ("image", "video", "text")
    batch = padded_batch(family, cases)
    # Drafting always pays here (a cost ratio of 1), so every step is one of the chains.
    policy = AutoPolicy(chain=ChainLengthConfig(warmup=(1, 4, 2, 7, 3)), gate=DraftGateConfig(cost_ratio=1.0))
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy, processor=family.processor)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert_rows_equal_their_own_generate(family, batch, out, cases)
    assert len({step.depth for step in spec.last_stats.steps}) > 2


@pytest.mark.parametrize(
    "policy",
    [SageConfig(fixed_shapes=True), SageGtConfig(sage=SageConfig(fixed_shapes=True))],
    ids=["sage", "sage-gt"],
)
def test_a_padded_batch_of_padded_trees_decodes_exactly(policy):
    """Trees grown as levels of fixed slots (as on accelerators), every row's real slots read at once."""
    family = FAMILIES["qwen2_5_vl"]
    batch = padded_batch(family)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert_rows_equal_their_own_generate(family, batch, out, ROWS)


@pytest.mark.parametrize(
    "processors",
    [{"repetition_penalty": 1.5}, {"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.2, "min_new_tokens": 8}],
    ids=["repetition-penalty", "no-repeat-ngram", "penalty-and-min-new-tokens"],
)
def test_a_padded_batch_with_logits_processors_equals_each_rows_own_generate(family, processors):
    """Processors that read each row's tokens: a repetition penalty serves all rows in one call (each row's tokens
    padded with its own last one), others run row by row; either way every row is its own `generate`."""
    batch = padded_batch(family)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], processor=family.processor)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS, **processors)
    assert_rows_equal_their_own_generate(family, batch, out, ROWS, **processors)


def test_a_batch_of_one_padded_row_decodes_as_the_row_alone(qwen):
    batch = padded_batch(qwen, ("long_prompt", "image"))
    row = {k: v[1:] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v for k, v in batch.items()}
    row["pixel_values"] = batch["pixel_values"][-qwen.cases["image"]["pixel_values"].shape[0] :]
    row["image_grid_thw"] = batch["image_grid_thw"][-1:]
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    out = spec.generate(**row, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(out, qwen.target.generate(**row, do_sample=False, max_new_tokens=NEW_TOKENS))


def test_stream_decodes_each_prompt_as_its_own_generate_with_its_own_budget(family):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], "sage")
    budgets = {case: 4 + 6 * i for i, case in enumerate(ROWS)}
    items = [(case, family.cases[case], {"max_new_tokens": budgets[case]}) for case in ROWS] * 2
    results = list(spec.stream(items, batch_size=3, do_sample=False))
    assert len(results) == 2 * len(ROWS)
    for result in results:
        assert result.error is None
        expected = family.target.generate(
            **family.cases[result.key], do_sample=False, max_new_tokens=budgets[result.key]
        )
        assert torch.equal(result.sequence, expected), result.key
        assert result.stats.new_tokens == expected.shape[1] - family.cases[result.key]["input_ids"].shape[1]


@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_greedy_and_sampling_prompts_in_one_batch_each_decode_as_alone(qwen, policy):
    """A greedy row gives the target's own ids; a sampling row with its own generator draws what it draws alone."""
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy)
    sampling = dict(do_sample=True, temperature=1.3, top_k=0, max_new_tokens=12)
    items = [
        ("greedy", qwen.cases["image"], {"do_sample": False, "max_new_tokens": 12}),
        ("sampled", qwen.cases["video"], {**sampling, "generator": torch.Generator().manual_seed(3)}),
    ]
    results = {r.key: r.sequence for r in spec.stream(items, batch_size=2)}
    greedy = qwen.target.generate(**qwen.cases["image"], do_sample=False, max_new_tokens=12)
    alone = spec.generate(**qwen.cases["video"], **sampling, generator=torch.Generator().manual_seed(3))
    assert torch.equal(results["greedy"], greedy)
    assert torch.equal(results["sampled"], alone)


class NoNodes(TreePolicy):
    """Entropy-shaped trees capped at no node at all: every step is a plain one."""

    def plan(self) -> TreePlan:
        return AdaptiveTreePlan(3, 4.0, max_nodes=0, top_k=10, threshold_scale=0.1)


class Teller(TreePolicy):
    """A fixed two-token chain whose `observe` notes whether each step's row samples (in `sampled`, this one policy's
    for every row) and hands back a fixed lesson."""

    LESSON = StepLesson(alpha=0.25, predicted_tokens=3.0, predicted_seconds=0.5)

    def __init__(self) -> None:
        self.sampled: list[bool] = []

    def for_row(self) -> Teller:
        """Every row notes into this policy's list."""
        return self

    def plan(self) -> TreePlan:
        return RankTreePlan([[0], [0, 0]])

    def observe(self, step: StepOutcome) -> StepLesson:
        self.sampled.append(step.sampled)
        return self.LESSON


def test_a_steps_record_keeps_what_the_policys_observe_handed_back(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], Teller())
    spec.generate(**qwen.cases["image"], do_sample=False, max_new_tokens=8)
    drafted = [step for step in spec.last_stats.steps if step.plain is None]
    assert drafted
    lesson = Teller.LESSON
    for step in drafted:
        assert (step.alpha, step.predicted_tokens, step.predicted_seconds) == (
            lesson.alpha,
            lesson.predicted_tokens,
            lesson.predicted_seconds,
        )


@pytest.mark.parametrize("do_sample", [False, True])
def test_every_step_tells_the_policy_whether_its_row_samples(qwen, do_sample):
    policy = Teller()
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy)
    spec.generate(**qwen.cases["image"], do_sample=do_sample, max_new_tokens=8)
    assert policy.sampled and set(policy.sampled) == {do_sample}


def test_rows_whose_trees_may_hold_no_node_decode_plain_steps_exactly(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], NoNodes())
    items = [(case, qwen.cases[case]) for case in ("image", "video")]
    results = {r.key: r for r in spec.stream(items, batch_size=2, do_sample=False, max_new_tokens=8)}
    for case, result in results.items():
        assert torch.equal(result.sequence, qwen.target.generate(**qwen.cases[case], do_sample=False, max_new_tokens=8))
        assert all(step.accepted == 0 for step in result.stats.steps)


def test_prompts_that_finish_at_their_prefill_do_not_end_the_stream(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain")
    items = [(f"one-{i}", qwen.cases["text"], {"max_new_tokens": 1}) for i in range(3)]
    items.append(("more", qwen.cases["image"], {"max_new_tokens": 4}))
    results = {r.key: r for r in spec.stream(items, batch_size=2, do_sample=False)}
    assert sorted(results) == ["more", "one-0", "one-1", "one-2"]
    expected = qwen.target.generate(**qwen.cases["image"], do_sample=False, max_new_tokens=4)
    assert torch.equal(results["more"].sequence, expected)


def test_a_finished_row_stops_costing(qwen):
    # Eager whatever the suite's compile setting: a compiled forward runs the model's hooks only while it is traced.
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain", compile="off")
    rows: list[int] = []
    hook = qwen.target.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        items = [
            ("short", qwen.cases["text"], {"max_new_tokens": 3}),
            ("long", qwen.cases["image"], {"max_new_tokens": 30}),
        ]
        keys = [r.key for r in spec.stream(items, batch_size=2, do_sample=False)]
    finally:
        hook.remove()
    assert keys == ["short", "long"]
    decoding = rows[1:]  # after both prompts' prefill in one forward
    assert 2 in decoding and decoding[-1] == 1
    assert decoding == sorted(decoding, reverse=True)


def test_sampled_batches_repeat_with_the_same_seed(qwen):
    batch = padded_batch(qwen, ("image", "video", "text"))
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    draws = [
        spec.generate(**batch, do_sample=True, max_new_tokens=12, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1])


def test_a_prompt_too_large_for_the_kv_budget_fails_alone(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    items = [("long", qwen.cases["long_prompt"]), ("short", qwen.cases["text"])]
    results = {r.key: r for r in spec.stream(items, kv_budget_gb=4e-4, do_sample=False, max_new_tokens=8)}
    assert isinstance(results["long"].error, MemoryBudgetError)
    assert "kv_budget_gb" in str(results["long"].error)
    expected = qwen.target.generate(**qwen.cases["text"], do_sample=False, max_new_tokens=8)
    assert torch.equal(results["short"].sequence, expected)


def test_rows_wait_for_room_in_the_kv_budget_and_still_decode_exactly(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    items = [(case, qwen.cases[case]) for case in ("text", "image", "video")]
    in_flight: list[int] = []
    hook = qwen.target.register_forward_pre_hook(
        lambda _, args, kwargs: in_flight.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        results = list(spec.stream(items, batch_size=3, kv_budget_gb=3e-4, do_sample=False, max_new_tokens=8))
    finally:
        hook.remove()
    assert max(in_flight) == 1
    for result in results:
        assert torch.equal(
            result.sequence, qwen.target.generate(**qwen.cases[result.key], do_sample=False, max_new_tokens=8)
        )


def test_a_streamer_with_a_batch_is_refused(qwen):
    from transformers import TextStreamer

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    with pytest.raises(ValueError, match="streamer"):
        spec.generate(**padded_batch(qwen, ("text", "image")), streamer=TextStreamer(qwen.processor.tokenizer))


def test_prompts_of_similar_lengths_joining_together_are_prefilled_in_one_target_forward(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain")
    shapes: list[tuple[int, ...]] = []
    hook = qwen.target.register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    items = [(i, dict(qwen.cases["image"])) for i in range(3)] + [(3, qwen.cases["long_prompt"])]
    try:
        results = {r.key: r.sequence for r in spec.stream(items, batch_size=4, do_sample=False, max_new_tokens=8)}
    finally:
        hook.remove()
    image, long = qwen.cases["image"]["input_ids"].shape[1], qwen.cases["long_prompt"]["input_ids"].shape[1]
    assert shapes[:2] == [(3, image), (1, long)]  # the long prompt would pad the others past the limit
    for key, inputs in items:
        assert torch.equal(results[key], qwen.target.generate(**inputs, do_sample=False, max_new_tokens=8))


class Recording:
    """transformers' streamer protocol, keeping what it is given."""

    def __init__(self):
        self.puts: list[torch.Tensor] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value)

    def end(self) -> None:
        self.ended += 1


def test_a_group_whose_joint_prefill_fails_is_admitted_alone_and_streamed_once(qwen, monkeypatch):
    from vlmspec.engine.prefill import Prefiller

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain")
    options = {"do_sample": True, "max_new_tokens": 8}

    def run(fail: bool) -> list[tuple[torch.Tensor, Recording]]:
        prefill_drafts = Prefiller.prefill_drafts
        failures = [fail]

        def failing(self, *args):
            if failures.pop() if failures else False:
                raise RuntimeError("out of memory")
            return prefill_drafts(self, *args)

        monkeypatch.setattr(Prefiller, "prefill_drafts", failing)
        streamers = [Recording() for _ in range(3)]
        requests = [
            spec.prepare(
                dict(qwen.cases["image"]),
                key=i,
                streamer=streamers[i],
                generator=torch.Generator().manual_seed(i),
                **options,
            )
            for i in range(3)
        ]
        results = {r.key: r.sequence for r in spec.decode(requests, batch_size=3)}
        monkeypatch.setattr(Prefiller, "prefill_drafts", prefill_drafts)
        return [(results[i], streamers[i]) for i in range(3)]

    for (sequence, streamer), (alone, _) in zip(run(fail=True), run(fail=False), strict=True):
        prompt = qwen.cases["image"]["input_ids"]
        assert torch.equal(streamer.puts[0], prompt) and all(p.ndim == 1 for p in streamer.puts[1:])
        assert torch.equal(torch.cat(streamer.puts[1:]), sequence[0, prompt.shape[1] :]) and streamer.ended == 1
        assert torch.equal(sequence, alone)


def test_draws_of_one_prompt_share_its_prefill_while_a_slot_holds_it_and_are_prefilled_again_after(qwen):
    """Requests sharing their inputs (draws of one prompt) admitted one after another copy the prompt from a slot that
    holds it (a row that took it in, or the free slot a finished one left), with no prefill of their own; once another
    prompt's pass took the slot, the next draw is prefilled again. Each decodes as `generate` does."""
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain")
    image, text = qwen.cases["image"], qwen.cases["text"]
    expected = [qwen.target.generate(**case, do_sample=False, max_new_tokens=8) for case in (image, text)]
    first = spec.prepare(image, key=(0, 0), do_sample=False, max_new_tokens=2)
    shared = dict(target_inputs=first.target_inputs, draft_inputs=first.draft_inputs)
    longer = replace(spec.prepare(image, key=(0, 1), do_sample=False, max_new_tokens=8), **shared)
    other = spec.prepare(text, key=(1, 0), do_sample=False, max_new_tokens=8)
    batches = {
        2: [first, longer, replace(longer, key=(0, 2))],
        1: [first, longer, other, replace(longer, key=(0, 2))],
    }
    prefilled = {2: [True, False, False], 1: [True, False, True, True]}
    for batch_size, requests in batches.items():
        results = {r.key: r for r in spec.decode(requests, batch_size=batch_size)}
        assert [results[r.key].stats.target_prefill_tokens > 0 for r in requests] == prefilled[batch_size]
        for (case, _), result in results.items():
            length = result.sequence.shape[1]
            assert torch.equal(result.sequence.cpu(), expected[case][:, :length].cpu())
