"""The replicas of the released checkpoints say what the released files say, and load with `transformers`' Auto classes.

Expected values are written out here as the released files have them, independently of `released_files.py`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from vlmspec.processors import load_processor

TARGET, DRAFT = 0, 1
#: (family, 0 target / 1 draft) -> what the released checkpoint has.
RELEASED_HEADS = {
    ("qwen2_5_vl", TARGET): 152064,
    ("qwen2_5_vl", DRAFT): 151936,
    ("qwen3_vl", TARGET): 151936,
    ("qwen3_vl", DRAFT): 151936,
    ("qwen3_vl_moe", TARGET): 151936,
    ("llava_onevision", TARGET): 152128,
    ("llava_onevision", DRAFT): 152000,
}
TIED = {
    ("qwen2_5_vl", TARGET): False,
    ("qwen2_5_vl", DRAFT): True,
    ("qwen3_vl", TARGET): False,
    ("qwen3_vl", DRAFT): True,
    ("qwen3_vl_moe", TARGET): False,
    ("llava_onevision", TARGET): False,
    ("llava_onevision", DRAFT): True,
}
TOKENIZER_LENGTHS = {"qwen2_5_vl": 151665, "qwen3_vl": 151669, "qwen3_vl_moe": 151669, "llava_onevision": 151648}
QWEN2_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|file_sep|>": 151664,
}
QWEN3_IDS = {**QWEN2_IDS, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
LLAVA_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<image>": 151646,
    "<video>": 151647,
}
SPECIAL_IDS = {"qwen2_5_vl": QWEN2_IDS, "qwen3_vl": QWEN3_IDS, "qwen3_vl_moe": QWEN3_IDS, "llava_onevision": LLAVA_IDS}
QWEN2_5_VL_GENERATION = {
    "do_sample": True,
    "top_k": 1,
    "top_p": 0.001,
    "temperature": 0.1,
    "repetition_penalty": 1.05,
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
}
QWEN3_VL_GENERATION = {
    "do_sample": True,
    "top_k": 20,
    "top_p": 0.8,
    "temperature": 0.7,
    "repetition_penalty": 1.0,
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
}
GENERATION = {
    "qwen2_5_vl": QWEN2_5_VL_GENERATION,
    "qwen3_vl": QWEN3_VL_GENERATION,
    "qwen3_vl_moe": QWEN3_VL_GENERATION,
    "llava_onevision": {"bos_token_id": 151643, "eos_token_id": 151645},
}
IMAGE_TURN = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]


def _read(directory: str, name: str) -> dict:
    return json.loads((Path(directory) / name).read_text())


@cache
def _tokenizer(directory: str):
    return AutoTokenizer.from_pretrained(directory)


@cache
def _processor(directory: str):
    return load_processor(directory)


@pytest.fixture(scope="module")
def checkpoints(replica_pairs) -> dict[tuple[str, int], str]:
    """(family, TARGET/DRAFT) -> replica directory, for the checkpoints listed in RELEASED_HEADS."""
    return {key: replica_pairs[key[0]][key[1]] for key in RELEASED_HEADS}


def test_every_readme_pair_is_replicated(replica_pairs):
    names = {family: tuple(Path(d).name for d in pair) for family, pair in replica_pairs.items()}
    assert names == {
        "qwen2_5_vl": ("Qwen--Qwen2.5-VL-7B-Instruct", "Qwen--Qwen2.5-VL-3B-Instruct"),
        "qwen3_vl": ("Qwen--Qwen3-VL-8B-Instruct", "Qwen--Qwen3-VL-2B-Instruct"),
        "qwen3_vl_moe": ("Qwen--Qwen3-VL-30B-A3B-Instruct", "Qwen--Qwen3-VL-2B-Instruct"),
        "llava_onevision": ("llava-hf--llava-onevision-qwen2-7b-ov-hf", "llava-hf--llava-onevision-qwen2-0.5b-ov-hf"),
    }


@pytest.mark.parametrize("key", list(RELEASED_HEADS), ids=str)
def test_vocabulary_sized_tensors_have_the_released_rows(checkpoints, key):
    with safe_open(Path(checkpoints[key]) / "model.safetensors", "pt") as weights:
        shapes = {name: weights.get_slice(name).get_shape() for name in weights.keys()}
    vocabulary_sized = {name: shape[0] for name, shape in shapes.items() if "embed_tokens" in name or "lm_head" in name}
    assert set(vocabulary_sized.values()) == {RELEASED_HEADS[key]}
    assert any("lm_head" in name for name in vocabulary_sized) is not TIED[key]


@pytest.mark.parametrize("key", list(RELEASED_HEADS), ids=str)
def test_a_model_class_loads_it_with_the_released_head_and_tying(checkpoints, key):
    config = AutoConfig.from_pretrained(checkpoints[key])
    model = getattr(transformers, config.architectures[0]).from_pretrained(checkpoints[key], dtype=torch.float32)
    head, embeddings = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head.shape[0] == RELEASED_HEADS[key]
    assert (head.data_ptr() == embeddings.data_ptr()) is TIED[key]


@pytest.mark.parametrize("key", list(RELEASED_HEADS), ids=str)
def test_weights_are_stored_in_the_released_dtype(checkpoints, key):
    expected = "F16" if key[0] == "llava_onevision" else "BF16"
    with safe_open(Path(checkpoints[key]) / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {expected}


def test_qwen2_5_vl_config_is_flat_with_the_released_mrope(replica_pairs):
    for directory in replica_pairs["qwen2_5_vl"]:
        config = _read(directory, "config.json")
        assert "text_config" not in config
        assert config["rope_scaling"] == {"type": "mrope", "mrope_section": [16, 24, 24]}
        assert config["torch_dtype"] == "bfloat16"
        assert (config["image_token_id"], config["video_token_id"]) == (151655, 151656)
        assert (config["vision_start_token_id"], config["vision_end_token_id"]) == (151652, 151653)
        parsed = AutoConfig.from_pretrained(directory).get_text_config()
        assert parsed.rope_parameters["mrope_section"] == [16, 24, 24]


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_config_nests_text_and_vision_as_released(replica_pairs, family):
    for directory in replica_pairs[family]:
        config = _read(directory, "config.json")
        text = config["text_config"]
        assert text["rope_scaling"] == {
            "mrope_interleaved": True,
            "mrope_section": [24, 20, 20],
            "rope_type": "default",
        }
        assert (text["head_dim"], text["dtype"], text["vocab_size"]) == (128, "bfloat16", 151936)
        assert "deepstack_visual_indexes" in config["vision_config"]
        assert (config["image_token_id"], config["video_token_id"]) == (151655, 151656)


def test_llava_onevision_config_names_its_special_tokens(replica_pairs):
    for directory in replica_pairs["llava_onevision"]:
        config = _read(directory, "config.json")
        assert (config["image_token_index"], config["video_token_index"]) == (151646, 151647)
        assert config["vision_feature_select_strategy"] == "full"
        assert config["vision_aspect_ratio"] == "anyres_max_9"
        assert AutoConfig.from_pretrained(directory).image_token_id == 151646


@pytest.mark.parametrize("family", list(GENERATION))
def test_generation_config_is_the_released_one(replica_pairs, family):
    for directory in replica_pairs[family]:
        written = _read(directory, "generation_config.json")
        written.pop("transformers_version")
        written.pop("_from_model_config", None)
        assert written == GENERATION[family]
        loaded = transformers.GenerationConfig.from_pretrained(directory)
        assert all(getattr(loaded, name) == value for name, value in GENERATION[family].items())


@pytest.mark.parametrize("family", list(SPECIAL_IDS))
def test_tokenizer_has_the_released_special_ids_and_length(replica_pairs, family):
    for directory in replica_pairs[family]:
        tokenizer = _tokenizer(directory)
        assert {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_IDS[family]} == SPECIAL_IDS[family]
        assert len(tokenizer) == TOKENIZER_LENGTHS[family]
        assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")


@pytest.mark.parametrize(
    ("family", "max_length"), [("qwen2_5_vl", 131072), ("qwen3_vl", 262144), ("llava_onevision", 32768)]
)
def test_tokenizer_config_fields_are_the_released_ones(replica_pairs, family, max_length):
    config = _read(replica_pairs[family][0], "tokenizer_config.json")
    assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|im_end|>", "<|endoftext|>", None)
    assert config["model_max_length"] == max_length
    decoder = {int(i): entry["content"] for i, entry in config["added_tokens_decoder"].items()}
    assert {token: i for i, token in decoder.items() if token in SPECIAL_IDS[family]} == SPECIAL_IDS[family]
    assert max(decoder) + 1 == TOKENIZER_LENGTHS[family]


def test_text_never_encodes_to_a_vocabulary_filler(replica_pairs):
    tokenizer = _tokenizer(replica_pairs["qwen2_5_vl"][0])
    text = "<filler150000> " + bytes(range(32, 127)).decode() + " Grüße, 你好 🙂\n\t<filler9999>"
    ids = tokenizer(text).input_ids
    assert max(ids) < 1000
    assert tokenizer.decode(ids) == text


def test_qwen2_5_vl_template_renders_the_default_system_prompt(replica_pairs):
    processor = _processor(replica_pairs["qwen2_5_vl"][0])
    assert processor.apply_chat_template(IMAGE_TURN) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen2_5_vl_template_labels_pictures_under_add_vision_id(replica_pairs):
    processor = _processor(replica_pairs["qwen2_5_vl"][0]).processor
    text = processor.apply_chat_template(IMAGE_TURN, tokenize=False, add_vision_id=True)
    assert "Picture 1: <|vision_start|><|image_pad|><|vision_end|>" in text


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_template_renders_no_system_prompt(replica_pairs, family):
    processor = _processor(replica_pairs[family][0])
    assert processor.apply_chat_template(IMAGE_TURN) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_vl_template_is_byte_for_byte_the_released_one(replica_pairs):
    import hashlib

    template = _read(replica_pairs["qwen3_vl"][0], "chat_template.json")["chat_template"]
    digest = hashlib.sha256(template.encode()).hexdigest()
    assert digest == "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


def test_llava_onevision_template_puts_the_image_on_its_own_line(replica_pairs):
    processor = _processor(replica_pairs["llava_onevision"][0])
    assert processor.apply_chat_template(IMAGE_TURN) == (
        "<|im_start|>user\n<image>\nDescribe.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_processor_configs_are_the_released_ones(replica_pairs):
    qwen2_5 = _read(replica_pairs["qwen2_5_vl"][0], "preprocessor_config.json")
    assert (qwen2_5["min_pixels"], qwen2_5["max_pixels"], qwen2_5["patch_size"]) == (3136, 12845056, 14)
    assert not (Path(replica_pairs["qwen2_5_vl"][0]) / "video_preprocessor_config.json").exists()
    qwen3 = _read(replica_pairs["qwen3_vl"][0], "preprocessor_config.json")
    assert (qwen3["size"], qwen3["patch_size"]) == ({"longest_edge": 16777216, "shortest_edge": 65536}, 16)
    qwen3_video = _read(replica_pairs["qwen3_vl"][0], "video_preprocessor_config.json")
    assert qwen3_video["size"] == {"longest_edge": 25165824, "shortest_edge": 4096}
    llava = _read(replica_pairs["llava_onevision"][0], "processor_config.json")
    assert (llava["num_image_tokens"], llava["vision_feature_select_strategy"]) == (729, "full")


@pytest.mark.parametrize("family", list(SPECIAL_IDS))
def test_the_loaded_processor_follows_the_released_preprocessing(replica_pairs, family):
    processor = _processor(replica_pairs[family][0]).processor
    image_processor = processor.image_processor
    if family == "llava_onevision":
        assert (image_processor.size, list(image_processor.image_mean)) == ({"height": 384, "width": 384}, [0.5] * 3)
    else:
        patch, pixels = (14, (3136, 12845056)) if family == "qwen2_5_vl" else (16, (65536, 16777216))
        assert image_processor.patch_size == patch
        assert (image_processor.size["shortest_edge"], image_processor.size["longest_edge"]) == pixels
