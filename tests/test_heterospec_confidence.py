"""The heterospec and confidence policies decode exactly what the target's own `generate` does, for every family, greedy
and sampled, with pruning, alone and in a padded batch; `vlmspec calibrate` fits a pair's bins, which the policy
loads from beside the draft and refuses for another pair."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, save_pair
from media_files import write_image
from sampling_cases import ALPHA, SAMPLES, speculative_test
from test_batch import assert_rows_equal_their_own_generate, padded_batch

from vlmspec import (
    CalibrationError,
    ConfidenceConfig,
    HeteroSpecConfig,
    PathEntropyBins,
    SpeculativeVLM,
)
from vlmspec.cli import EXIT_CONFIGURATION, main
from vlmspec.eval.calibrate import calibrate
from vlmspec.policies import CALIBRATION_FILE

#: Bins that send the tiny pairs' steps into low and high bins alike (their path entropies span about 0 to 10).
BINS = PathEntropyBins(edges=[0.5, 1.5, 3.0, 6.0])
POLICIES = {"heterospec": HeteroSpecConfig(bins=BINS), "confidence": ConfidenceConfig()}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("case", ["image", "video"])
def test_greedy_output_with_pruning_equals_target_generate(family, case, policy):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=POLICIES[policy], pruning="verifier")
    out = spec.generate(**family.cases[case], max_new_tokens=32)
    assert torch.equal(out, family.reference(case))
    assert max(step.tree_depth for step in spec.last_stats.steps) >= 2


def test_heterospec_trees_change_depth_and_size_with_the_bins(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["self"], policy=POLICIES["heterospec"], pruning=None)
    assert torch.equal(spec.generate(**qwen.cases["image"], max_new_tokens=32), qwen.reference("image"))
    steps = spec.last_stats.steps
    assert len({(step.depth, step.nodes) for step in steps}) > 2


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_row_of_a_padded_batch_equals_its_own_generate(family, policy):
    cases = ("two_images", "video", "text")
    batch = padded_batch(family, cases)
    spec = SpeculativeVLM(family.target, family.drafts["independent"], POLICIES[policy], pruning="verifier")
    out = spec.generate(**batch, do_sample=False, max_new_tokens=24)
    assert_rows_equal_their_own_generate(family, batch, out, cases)


@pytest.mark.parametrize(
    ("policy", "draft", "case", "warp"),
    [("heterospec", "noisy", "image", "top_k_top_p"), ("confidence", "noisy", "video", "temperature")],
)
def test_samples_drawn_together_follow_the_targets_exact_distribution(policy, draft, case, warp):
    result, stats = speculative_test(POLICIES[policy], draft, case, warp)
    assert result.samples == SAMPLES and result.impossible == 0
    assert result.passes(ALPHA), result
    assert max(step.accepted for step in stats.steps) >= 2


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    """The Qwen2.5-VL tiny pair (the target as its own draft: its paths are accepted whole) as `save_pretrained`
    folders, and a folder of images to calibrate on."""
    root = tmp_path_factory.mktemp("pair")
    target, draft = save_pair(FAMILIES["qwen2_5_vl"], root, draft="self")
    media = root / "media"
    media.mkdir()
    for seed in range(4):
        write_image(media / f"{seed}.png", seed=seed)
    return target, draft, str(media)


def test_calibrate_writes_bins_beside_the_draft_that_the_policy_loads_by_name(saved_pair):
    target, draft, media = saved_pair
    spec = SpeculativeVLM.from_pretrained(target, draft)
    run = calibrate(spec, data=media, n=4, max_new_tokens=48, progress=False)
    assert run.path.parent.samefile(draft) and run.path.name == CALIBRATION_FILE
    assert run.bins.fitted["paths"] >= 16 and 1 <= run.bins.bins <= 8
    assert set(run.bins.pair) == {"target", "draft"}
    loaded = SpeculativeVLM.from_pretrained(target, draft, policy="heterospec")
    assert loaded.policy.bins.edges == run.bins.edges
    inputs = FAMILIES["qwen2_5_vl"].cases["image"]
    reference = loaded.target.generate(**inputs, do_sample=False, max_new_tokens=24)
    assert torch.equal(loaded.generate(**inputs, do_sample=False, max_new_tokens=24), reference)


def test_bins_fitted_to_another_draft_are_refused_naming_it(saved_pair):
    target, draft, _ = saved_pair
    spec = SpeculativeVLM.from_pretrained(target, draft)
    bins = PathEntropyBins(edges=[1.0], pair={"target": {}, "draft": {"checksum": "0" * 16}})
    with pytest.raises(CalibrationError, match="another draft.*checksum.*vlmspec calibrate"):
        spec.with_options(HeteroSpecConfig(bins=bins))


def test_heterospec_without_bins_names_the_command_that_fits_them(qwen):
    with pytest.raises(CalibrationError, match="vlmspec calibrate"):
        SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="heterospec")


def test_the_calibrate_command_prints_the_bins_and_writes_them_where_told(saved_pair, tmp_path, capsys):
    target, draft, media = saved_pair
    out = tmp_path / "bins.json"
    main(["calibrate", "--target", target, "--draft", draft, "--data", media, "--n", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| bin | Phi(P*) | paths | mean TCR | depth | nodes |" in printed and f"bins written to {out}" in printed
    assert PathEntropyBins.load(out).pair["draft"]["model_type"] == "qwen2_5_vl"


def test_the_calibrate_command_refuses_no_prompts(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["calibrate", "--n", "0"])
    assert stopped.value.code == EXIT_CONFIGURATION and "--n" in capsys.readouterr().err
