"""Sampling is lossless: speculative samples follow the target's own exact distribution, on every kind of tree.

The exact distribution of 6-token continuations is enumerated with the target alone, through its own
`generate(do_sample=True)` (prefixes rarer than a minimum mass stand for all their continuations); 2,000 seeded
speculative samples (drawn together as a batch's rows, and once one call at a time) are compared with it by a G test
(`sampling_cases`). Six tokens take every tree below its first level and SAGE past its fixed first tree into its
entropy-shaped ones. `test_sampling_harness.py` checks the harness
both ways. `scripts/sampling_sweep.py` runs the whole grid of policies, drafts, inputs and warpers.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE
from sampling_cases import ALPHA, FAMILY, NEW_TOKENS, SAMPLES, WARPS, alone_test, exact, speculative_test

from vlmspec import SageGtConfig, SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.testing import noisy_copy
from vlmspec.testing.distribution import continuations, eos_ids, exact_continuations, g_test

#: sage-gt's cost model is shared by a batch's rows and observes one step of them all: the draws (decoded together)
#: reach its cost-shaped trees after one step, not its default four, within six tokens.
SAGE_GT = SageGtConfig(warmup_steps=1)


@pytest.mark.parametrize(
    "policy, draft, case, warp",
    [
        ("chain", "noisy", "video", "top_k_top_p"),
        ("static-tree", "independent", "text", "temperature"),
        ("sage", "noisy", "image", "top_k_top_p"),
        ("sage", "self", "video", "temperature"),
        ("sage-gt", "noisy", "video", "temperature"),
    ],
)
def test_speculative_samples_follow_the_targets_exact_distribution(policy, draft, case, warp):
    result, stats = speculative_test(SAGE_GT if policy == "sage-gt" else policy, draft, case, warp)
    assert result.samples == SAMPLES and result.impossible == 0
    assert result.passes(ALPHA), result
    assert max(step.tree_depth for step in stats.steps) >= 2
    if draft != "independent":
        assert max(step.accepted for step in stats.steps) >= 2
    if policy == "sage":
        assert len({step.alpha for step in stats.steps}) > 2
    if policy == "sage-gt":
        assert sum(step.predicted_tokens is not None for step in stats.steps) > len(stats.steps) // 2


def test_a_sequence_decoded_alone_samples_the_targets_exact_distribution():
    """The one-sequence decoder (a call per draw, no batch) on SAGE's entropy-shaped trees."""
    result, stats = alone_test("sage", "noisy", "text", "temperature")
    assert result.samples == SAMPLES and result.impossible == 0
    assert result.passes(ALPHA), result
    steps = [step for call in stats for step in call.steps]
    assert max(step.accepted for step in steps) >= 2 and len({step.alpha for step in steps}) > 2


def test_the_same_seed_draws_the_same_samples():
    inputs = FAMILY.cases["text"]
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy="sage")

    def sample(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return spec.generate(**inputs, do_sample=True, max_new_tokens=16, generator=generator, temperature=1.5)

    def sample_global(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return spec.generate(**inputs, do_sample=True, max_new_tokens=16, temperature=1.5)

    assert torch.equal(sample(3), sample(3)) and not torch.equal(sample(3), sample(4))
    assert torch.equal(sample_global(3), sample_global(3))


class _Collect:
    """A streamer that keeps what it is given."""

    def __init__(self):
        self.tokens: list[int] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.tokens.extend(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True


def _sample_with_early_eos(family, case: str, seed: int, **settings) -> tuple[list[int], list[int], _Collect]:
    """Sampled new tokens with half the vocabulary as EOS (generation would stop almost at once), the EOS ids and
    what a streamer received."""
    eos = list(range(0, family.target.config.get_text_config().vocab_size, 2))
    streamer = _Collect()
    spec = SpeculativeVLM(family.target, family.drafts["noisy"])
    inputs = family.cases[case]
    sequence = spec.generate(
        **inputs,
        do_sample=True,
        temperature=1.5,
        eos_token_id=eos,
        streamer=streamer,
        generator=torch.Generator().manual_seed(seed),
        **settings,
    )
    return sequence[0, inputs["input_ids"].shape[1] :].tolist(), eos, streamer


@pytest.mark.parametrize("case", ["image", "video"])
def test_sampling_stops_at_the_first_eos_or_the_budget(family, case):
    for seed in range(3):
        new, eos, _ = _sample_with_early_eos(family, case, seed, max_new_tokens=10)
        assert 1 <= len(new) <= 10 and not set(new[:-1]) & set(eos)
        assert new[-1] in eos or len(new) == 10


@pytest.mark.parametrize("case", ["image", "video"])
def test_sampling_honours_min_new_tokens(family, case):
    for seed in range(3):
        new, eos, _ = _sample_with_early_eos(family, case, seed, max_new_tokens=10, min_new_tokens=4)
        assert len(new) > 4 and not set(new[:4]) & set(eos)


def test_sampling_streams_the_prompt_then_each_accepted_token(qwen):
    new, _, streamer = _sample_with_early_eos(qwen, "image", 0, max_new_tokens=10, min_new_tokens=6)
    assert streamer.tokens == qwen.cases["image"]["input_ids"][0].tolist() + new and streamer.ended


def test_several_return_sequences_are_padded_after_eos_as_generate_pads(qwen):
    inputs = qwen.cases["text"]
    eos = list(range(0, qwen.target.config.get_text_config().vocab_size, 2))
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    settings = dict(do_sample=True, eos_token_id=eos, pad_token_id=1, max_new_tokens=8, num_return_sequences=6)
    sequences = spec.generate(**inputs, generator=torch.Generator().manual_seed(0), **settings)
    prompt_length = inputs["input_ids"].shape[1]
    assert sequences.shape[0] == 6 and sequences.shape[1] <= prompt_length + 8
    assert torch.equal(sequences[:, :prompt_length], inputs["input_ids"].expand(6, -1))
    for row in sequences[:, prompt_length:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        assert ends and all(t == 1 for t in row[ends[0] + 1 :])


def test_several_return_sequences_need_sampling(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    with pytest.raises(ValueError, match="num_return_sequences"):
        spec.generate(**qwen.cases["text"], do_sample=False, num_return_sequences=2, max_new_tokens=4)


def test_every_row_of_a_sampled_batch_follows_its_prompts_exact_distribution():
    """A padded batch of an image row and a video row, each drawn SAMPLES times in one batched call: every row's
    draws pass the G test against its own prompt's exact distribution."""
    cases = ("image", "video")
    adapter = adapter_for(FAMILY.target)
    pad = FAMILY.processor.tokenizer.pad_token_id
    batch = {
        k: v.to(FAMILY.target.device) for k, v in adapter.join_rows([FAMILY.cpu_cases[c] for c in cases], pad).items()
    }
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy="sage")
    sequences = spec.generate(
        **batch,
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        num_return_sequences=SAMPLES,
        generator=torch.Generator().manual_seed(1),
        **WARPS["top_k_top_p"],
    )
    width = batch["input_ids"].shape[1]
    for b, case in enumerate(cases):
        rows = sequences[b * SAMPLES : (b + 1) * SAMPLES]
        result = g_test(continuations(rows, width, eos_ids(FAMILY.target, {})), exact(case, "top_k_top_p"))
        assert result.samples == SAMPLES and result.impossible == 0
        assert result.passes(ALPHA), (case, result)
    assert max(step.accepted for step in spec.last_stats.steps) >= 2


@pytest.mark.parametrize("penalty", [None, 2.0])
@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_rows_drafting_together_draw_what_each_draws_alone_from_its_own_generator(policy, penalty):
    """Sampled chains, or SAGE's trees of each row's own shape, at batch size 4 (every row's step as one set of
    tensors, the rows' processors in one call) and one at a time (the one-sequence engine), each prompt with its own
    seeded generator, with and without a repetition penalty (which reads each row's own tokens): the same tokens, row
    for row (so each row's tree is the one it grows alone)."""
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy=policy)

    def run(batch_size: int) -> dict[tuple[str, int], list[int]]:
        items = [
            ((case, i), FAMILY.cpu_cases[case], {"generator": torch.Generator().manual_seed(i)})
            for i in range(4)
            for case in ("image", "video")
        ]
        options = {} if penalty is None else {"repetition_penalty": penalty}
        results = spec.stream(
            items, batch_size=batch_size, do_sample=True, max_new_tokens=24, **WARPS["top_k_top_p"], **options
        )
        return {r.key: r.sequence[0].tolist() for r in results}

    assert run(4) == run(1)


@pytest.mark.skipif(DEVICE.type == "cpu", reason="needs the target on an accelerator and the draft on the CPU")
def test_a_draft_on_another_device_proposes_under_the_targets_processors(family):
    draft = noisy_copy(family.target, 0.05).to("cpu")
    inputs = family.cases["image"]
    settings = dict(do_sample=False, max_new_tokens=12, min_new_tokens=4, repetition_penalty=1.3)
    expected = family.target.generate(**inputs, **settings)
    assert torch.equal(SpeculativeVLM(family.target, draft).generate(**inputs, **settings), expected)


def test_samples_from_embeddings_follow_the_targets_exact_distribution():
    """Embeddings in place of the ids (the target reads them, the draft their tokens) against the distribution
    `generate` samples from the ids, which embeddings of them give the very same."""
    inputs = dict(FAMILY.cases["image"])
    embeds = FAMILY.target.get_input_embeddings()(inputs["input_ids"])
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy="sage")
    sequences = spec.generate(
        **inputs,
        inputs_embeds=embeds,
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        num_return_sequences=SAMPLES,
        generator=torch.Generator().manual_seed(0),
        **WARPS["top_k_top_p"],
    )
    samples = continuations(sequences, inputs["input_ids"].shape[1], eos_ids(FAMILY.target, {}))
    result = g_test(samples, exact("image", "top_k_top_p"))
    assert result.samples == SAMPLES and result.impossible == 0 and result.passes(ALPHA), result


def test_samples_of_a_next_turn_from_the_returned_cache_follow_generates_distribution_going_on():
    """The next turn's exact distribution is enumerated with `generate` over the whole conversation; SpeculativeVLM
    draws it going on from the cache its first turn returned (a batch of one row per sample, the cache's row
    repeated)."""
    first = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy="sage").generate(
        **FAMILY.cases["text"], do_sample=False, max_new_tokens=6, return_dict_in_generate=True
    )
    new = FAMILY.processor.tokenizer(" and then?", return_tensors="pt").input_ids.to(DEVICE)
    ids = torch.cat([first.sequences, new], 1)
    turn = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.zeros_like(ids))
    exact_turn = exact_continuations(FAMILY.target, turn, NEW_TOKENS, 0.005, **WARPS["top_k_top_p"])
    cache = first.past_key_values
    cache.batch_repeat_interleave(SAMPLES)
    sequences = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy="sage").generate(
        **{k: v.expand(SAMPLES, -1) for k, v in turn.items()},
        cache=cache,
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        generator=torch.Generator().manual_seed(0),
        **WARPS["top_k_top_p"],
    )
    samples = continuations(sequences, ids.shape[1], eos_ids(FAMILY.target, {}))
    result = g_test(samples, exact_turn)
    assert result.samples == SAMPLES and result.impossible == 0 and result.passes(ALPHA), result
