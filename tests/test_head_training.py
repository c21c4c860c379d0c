"""`vlmspec train-draft` trains draft heads: the training-time test's pieces on made-up tensors (the unrolled steps'
visibility, the shift of each step's targets, the step weights, the draft-vocabulary restriction and counts), and on
a tiny target a new head that trains, saves in the released layout and decodes exactly, and resumes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILIES, save_pair
from media_files import write_sample_images
from transformers import DynamicCache

from vlmspec import InvalidArgumentError, SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.engine.features import FeatureTap
from vlmspec.heads.fit import check_head
from vlmspec.heads.new import new_head
from vlmspec.processors import append_tokens
from vlmspec.testing.heads import random_head
from vlmspec.training import TrainSettings, VSDConfig, train_draft
from vlmspec.training.drafters import frequent_ids
from vlmspec.training.examples import Example
from vlmspec.training.head_examples import head_inputs, unrolled_outputs
from vlmspec.training.head_objectives import (
    restricted,
    soft_cross_entropy,
    step_weights,
    ttt_loss,
    unrolled_mask,
    unrolled_rows,
)

FAMILY = FAMILIES["qwen2_5_vl"]


def test_the_steps_are_weighted_by_powers_of_0_8():
    assert torch.allclose(step_weights(4), torch.tensor([1.0, 0.8, 0.64, 0.512]))
    losses = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]
    assert torch.isclose(ttt_loss(losses), torch.tensor(1.0 + 0.8 * 2.0 + 0.64 * 3.0))


def test_an_unrolled_step_sees_step_0_up_to_its_chain_and_its_own_chain_at_every_later_step():
    """Five step-0 entries, the last three of them chains: at step 2, chain c (entry 2 + c) sees entries 0..2 + c of
    step 0, then its own entry of step 1 (of 2 chains) and of step 2 (of 1 chain)."""
    mask = unrolled_mask(entries=5, chains=3, step=2)
    assert mask.shape == (1, 5 + 2 + 1)
    assert mask[0].tolist() == [True, True, True, False, False, True, False, True]
    step1 = unrolled_mask(entries=5, chains=3, step=1)
    assert step1.tolist() == [
        [True, True, True, False, False, True, False],
        [True, True, True, True, False, False, True],
    ]


def test_each_step_predicts_the_response_token_one_further_along():
    """A prompt of 4 tokens and a response of 3 (sequence 0..6, entries 0..4): chain c is entry 7 - 2 - 3 + c; step
    k of entry j reads token j + 1 + k and predicts token j + 2 + k, response row j + 2 + k - 4."""
    rows, valid = unrolled_rows(prompt=4, response=3, chains=3, step=0)
    assert rows.tolist() == [0, 1, 2] and valid.tolist() == [True, True, True]
    rows, valid = unrolled_rows(prompt=4, response=3, chains=3, step=1)
    assert rows.tolist() == [1, 2] and valid.tolist() == [True, True]
    rows, valid = unrolled_rows(prompt=4, response=3, chains=4, step=1)  # a chain from the prompt's last entry
    assert rows.tolist() == [0, 1, 2] and valid.tolist() == [True, True, True]
    _, valid = unrolled_rows(prompt=4, response=3, chains=4, step=0)
    assert valid.tolist() == [False, True, True, True]


def test_the_targets_distribution_is_restricted_to_the_draft_vocabulary_and_renormalised():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5]])
    kept = restricted(probs, torch.tensor([1, 3]))
    assert torch.allclose(kept, torch.tensor([[1 / 3, 2 / 3], [0.5, 0.5]]))


def test_the_soft_cross_entropy_averages_the_valid_rows_only():
    log_probs = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss = soft_cross_entropy(log_probs, target, torch.tensor([True, False]))
    assert torch.isclose(loss, -torch.log(torch.tensor(0.5)))
    assert soft_cross_entropy(log_probs, target, torch.tensor([False, False])) == 0


def test_a_new_heads_vocabulary_is_the_most_frequent_response_tokens_sorted():
    responses = [torch.tensor([5, 5, 7, 2]), torch.tensor([7, 5, 9, 12])]
    assert frequent_ids(responses, limit=10, size=3).tolist() == [2, 5, 7]  # 12 is past the limit; 2 < 9 on a tie
    summed = frequent_ids(responses, limit=10, size=2, reduce=lambda counts: counts + torch.eye(10)[9] * 5)
    assert summed.tolist() == [5, 9]


@pytest.fixture
def pair(tmp_path):
    target, _ = save_pair(FAMILY, tmp_path, "noisy")
    return target, write_sample_images(tmp_path / "data")


def _settings(pair, out, **changes) -> TrainSettings:
    target, data = pair
    base = dict(target=target, draft=None, data=str(data), out=str(out), steps=2, max_new_tokens=8, lr=1e-3)
    return TrainSettings(**{**base, **changes})


@pytest.mark.parametrize("objective", ["kd", "vsd"])
def test_a_new_head_trains_saves_in_the_released_layout_and_decodes_exactly(pair, tmp_path, objective):
    out = tmp_path / "head"
    vsd = VSDConfig(samples=3, length=2, anchors=1)
    settings = _settings(
        pair, out, draft_vocab=100, ttt_steps=3, eval_every=2, eval_items=1, objective=objective, vsd=vsd
    )
    folder = train_draft(settings)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["step 0"] > 0 for r in records)
    assert all(("vsd" in r) == (objective == "vsd") and r["loss"] == r["loss"] for r in records)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 100
    assert json.loads((out / "eval.jsonl").read_text().splitlines()[-1])["exact"] == 1.0
    spec = SpeculativeVLM.from_pretrained(pair[0], str(folder), compile="off")
    assert type(spec.draft).__name__ == "Eagle3Head"
    assert torch.equal(spec.generate(**FAMILY.cases["image"], max_new_tokens=12), FAMILY.reference("image", 12))


def test_a_head_goes_on_training_from_a_saved_head_and_from_its_checkpoint(pair, tmp_path):
    first = train_draft(_settings(pair, tmp_path / "first", draft_vocab=64))
    out = tmp_path / "second"
    train_draft(_settings(pair, out, draft=str(first), checkpoint_every=1))
    train_draft(_settings(pair, out, draft=str(first), checkpoint_every=1, steps=3), resume=True)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert json.loads((out / "settings.json").read_text())["kind"] == "head"


def test_what_a_head_cannot_train_by_is_refused_by_name(pair, tmp_path):
    with pytest.raises(InvalidArgumentError, match="--kind model needs --draft"):
        _settings(pair, tmp_path, kind="model")
    with pytest.raises(InvalidArgumentError, match="--ttt-steps"):
        _settings(pair, tmp_path, ttt_steps=0)


def test_a_new_head_starts_from_the_targets_output_rows_for_its_draft_ids():
    ids = torch.tensor([3, 10, 42, 99])
    head = new_head(FAMILY.target, ids)
    assert head.draft_to_target().tolist() == ids.tolist() and head.t2d.sum() == 4 and bool(head.t2d[42])
    assert torch.equal(head.lm_head.weight, FAMILY.target.get_output_embeddings().weight[ids].float())
    assert head.head_config.intermediate_size == FAMILY.target.config.get_text_config().intermediate_size


def test_each_unrolled_step_computes_what_the_head_computes_for_that_chain_level_by_level():
    """The training-time test's masks and positions give each chain's step k the head's output at tree depth k, as
    decoding computes it: its prompt pass over the entries up to the chain's, then one token a level, each beside
    the level before's output."""
    target = FAMILY.target
    head = random_head(target, seed=2, layer_ids=[0, 0, 1])
    adapter = adapter_for(target)
    tap = FeatureTap.on(adapter.language_model, check_head(head, target))
    inputs = FAMILY.cases["image"]
    response = FAMILY.reference("image", 6)[0, inputs["input_ids"].shape[1] :]
    full = append_tokens(inputs, response)
    with torch.no_grad():
        target(**adapter.model_inputs(full), position_ids=adapter.prompt_positions(full))
        example = Example(inputs, response, None, torch.zeros(len(response), 8))
        seen = head_inputs(example, tap.take(), adapter.prompt_positions(full))
        chains, steps = 5, 3
        outputs = unrolled_outputs(head, seen, chains, steps)
        ids, positions, features = seen.ids, seen.positions, seen.features
        for c in (0, chains - steps):
            j = len(ids) - 2 - chains + c
            cache = DynamicCache(config=head.config)
            out = head(
                ids[1 : j + 2][None], positions[..., : j + 1][..., None, :], features[: j + 1][None], None, cache
            )
            hidden = out.hidden_states[:, -1:]
            for k in range(1, steps):
                place = positions[..., j + k][..., None, None]
                hidden = head(ids[j + 1 + k][None, None], place, hidden, None, cache).hidden_states
                torch.testing.assert_close(hidden[0, 0], outputs[k][c], rtol=1e-4, atol=1e-5)
