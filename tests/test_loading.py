"""Loading pairs with `from_pretrained` from directories written by `save_pretrained`, for every family."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import FAMILIES, device_map, save_pair
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from vlmspec import SpeculativeVLM, UnsupportedAttentionError, UnsupportedModelError, VocabularyMismatchError
from vlmspec.loading import checkpoint_dtype, quantization_config
from vlmspec.processors import VisualInputs
from vlmspec.testing import build_tokenizer, chat_inputs, replica_config, sample_frames, sample_image
from vlmspec.testing.llava_onevision import llava_tokenizer
from vlmspec.testing.released_files import LLAVA_OV_7B, QWEN2_5_VL_7B, QWEN3_VL_8B


@pytest.fixture(scope="module")
def saved_pairs(tmp_path_factory):
    """Per family: target and processor in one directory, independent draft and tokenizer in another."""
    return {name: save_pair(family, tmp_path_factory.mktemp(name), "independent") for name, family in FAMILIES.items()}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_from_pretrained_loads_a_pair_that_decodes_exactly(saved_pairs, name):
    target_dir, draft_dir = saved_pairs[name]
    spec = SpeculativeVLM.from_pretrained(target_dir, draft_dir, policy="sage")
    assert isinstance(spec.processor, VisualInputs)
    assert type(spec.target) is type(FAMILIES[name].target)
    for inputs in (
        chat_inputs(spec.processor, "Describe the image in detail.", images=[sample_image(0)]),
        chat_inputs(spec.processor, "Describe the video in detail.", video=sample_frames(1, num_frames=4)),
    ):
        expected = spec.target.generate(**inputs, do_sample=False, max_new_tokens=16)
        assert torch.equal(spec.generate(**inputs, max_new_tokens=16), expected)


def test_loaded_processor_matches_the_one_that_was_saved(saved_pairs):
    target_dir, _ = saved_pairs["qwen2_5_vl"]
    spec = SpeculativeVLM.from_pretrained(target_dir, saved_pairs["qwen2_5_vl"][1])
    original = FAMILIES["qwen2_5_vl"].processor
    for kwargs in ({"images": [sample_image(4)]}, {"video": sample_frames(2, num_frames=6)}):
        a = chat_inputs(original, "What is shown here?", **kwargs)
        b = chat_inputs(spec.processor, "What is shown here?", **kwargs)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("quantization", "policy"), [("8bit", "static-tree"), ("4bit", "chain")])
def test_a_quantized_target_decodes_exactly_like_its_own_greedy_generate(saved_pairs, quantization, policy):
    target_dir, draft_dir = saved_pairs["qwen2_5_vl"]
    spec = SpeculativeVLM.from_pretrained(
        target_dir, draft_dir, target_quantization=quantization, policy=policy, device_map=device_map()
    )
    assert quantization in type(spec.target.model.language_model.layers[0].self_attn.q_proj).__name__
    inputs = chat_inputs(spec.processor, "Describe the image in detail.", images=[sample_image(0)])
    inputs = {k: v.to(spec.target.device) for k, v in inputs.items()}
    expected = spec.target.generate(**inputs, do_sample=False, max_new_tokens=16)
    assert torch.equal(spec.generate(**inputs, max_new_tokens=16), expected)


def test_a_pair_with_different_tokenizers_is_refused(saved_pairs, tmp_path):
    target_dir, _ = saved_pairs["qwen2_5_vl"]
    other = tmp_path / "other"
    FAMILIES["qwen2_5_vl"].drafts["independent"].save_pretrained(other)
    build_tokenizer(vocab_size=300).save_pretrained(other)
    with pytest.raises(VocabularyMismatchError, match="tokenizers"):
        SpeculativeVLM.from_pretrained(target_dir, str(other))


def test_a_pair_across_families_is_refused(saved_pairs):
    with pytest.raises(VocabularyMismatchError):
        SpeculativeVLM.from_pretrained(saved_pairs["qwen2_5_vl"][0], saved_pairs["llava_onevision"][1])


def test_an_unsupported_checkpoint_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(llava_tokenizer()))).save_pretrained(
        tmp_path
    )
    llava_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        SpeculativeVLM.from_pretrained(str(tmp_path), str(tmp_path))


def test_device_map_auto_places_both_models_and_decodes_exactly(saved_pairs):
    target_dir, draft_dir = saved_pairs["qwen3_vl_moe"]
    spec = SpeculativeVLM.from_pretrained(target_dir, draft_dir, device_map="auto", torch_dtype=torch.float32)
    assert spec.draft.get_input_embeddings().weight.device == spec.target.get_input_embeddings().weight.device
    inputs = chat_inputs(spec.processor, "Describe the image in detail.", images=[sample_image(5)])
    inputs = {k: v.to(spec.target.device) for k, v in inputs.items()}
    expected = spec.target.generate(**inputs, do_sample=False, max_new_tokens=16)
    assert torch.equal(spec.generate(**inputs, max_new_tokens=16), expected)


@pytest.mark.parametrize("checkpoint", [QWEN2_5_VL_7B, QWEN3_VL_8B, LLAVA_OV_7B])
def test_the_4bit_preset_computes_in_the_checkpoints_own_dtype(tmp_path, checkpoint):
    """With the default dtype ("auto"), 4-bit weights dequantise to the released bfloat16, not float32."""
    (tmp_path / "config.json").write_text(json.dumps(replica_config(checkpoint)))
    for torch_dtype in (None, "auto"):
        dtype = checkpoint_dtype(str(tmp_path), torch_dtype)
        assert dtype == torch.bfloat16
        model_class = type(FAMILIES["qwen2_5_vl"].target)
        assert quantization_config("4bit", model_class, dtype).bnb_4bit_compute_dtype == torch.bfloat16
    assert checkpoint_dtype(str(tmp_path), "float16") == torch.float16
    assert checkpoint_dtype(str(tmp_path), torch.float32) == torch.float32


def test_flash_attention_is_refused_before_any_weights_load(saved_pairs):
    target_dir, draft_dir = saved_pairs["qwen2_5_vl"]
    with pytest.raises(UnsupportedAttentionError, match="flash_attention_2.*sdpa, eager"):
        SpeculativeVLM.from_pretrained(target_dir, draft_dir, attn_implementation="flash_attention_2")


def test_a_model_attending_through_an_implementation_without_tree_masks_is_refused(qwen):
    """Attention registered under another name may drop the 4-D mask; only SDPA and eager are known to apply it."""
    AttentionInterface.register("custom_kernel", sdpa_attention_forward)
    target = copy.deepcopy(qwen.target)
    target.set_attn_implementation("custom_kernel")
    with pytest.raises(UnsupportedAttentionError, match="the target .*custom_kernel"):
        SpeculativeVLM(target, qwen.drafts["noisy"])
    with pytest.raises(UnsupportedAttentionError, match="the draft .*custom_kernel"):
        SpeculativeVLM(qwen.target, target)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_sdpa_and_eager_attention_decode_exactly(qwen, implementation):
    target = copy.deepcopy(qwen.target)
    target.set_attn_implementation(implementation)
    spec = SpeculativeVLM(target, qwen.drafts["noisy"], policy="static-tree")
    assert torch.equal(spec.generate(**qwen.cases["image"], max_new_tokens=24), qwen.reference("image", 24))
