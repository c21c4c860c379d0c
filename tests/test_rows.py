"""Batches of prompts: `split_rows` takes a processor's left-padded batch apart into each prompt's own inputs and
`join_rows` collates those back into the batch, for every family (text-only, image, video and mixed rows)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import FAMILIES, Family, on_device
from transformers import LlavaOnevisionConfig, LlavaOnevisionProcessor
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import LlavaOnevisionImageProcessorPil
from transformers.utils import is_torchvision_available

from vlmspec.adapters import ModelAdapter, adapter_for
from vlmspec.adapters.llava_onevision import LlavaOnevisionAdapter
from vlmspec.processors import VisualInputs, chat_messages, image_only, load_processor
from vlmspec.testing import sample_frames, sample_image
from vlmspec.testing.llava_onevision import llava_tokenizer

needs_torchvision = pytest.mark.skipif(not is_torchvision_available(), reason="transformers' video processors need it")

#: Rows of a batch: (prompt, image sizes, video frame counts); images differ in size, so in patches and tokens.
BATCHES: dict[str, list[tuple[str, list[tuple[int, int]], list[int]]]] = {
    "text": [("Hi", [], []), ("Describe the image in detail.", [], [])],
    "image": [("Describe the image in detail.", [(96, 128)], []), ("What is shown here?", [(40, 40), (64, 200)], [])],
    "mixed": [
        ("Hi", [], []),
        ("Describe the image in detail.", [(96, 128)], []),
        ("What is shown here?", [(40, 40), (40, 56)], []),
        ("A wide one.", [(64, 200)], []),
    ],
    "video": [
        ("Describe the video in detail.", [], [4]),
        ("Hi", [], []),
        ("What is shown here?", [(40, 40)], [4]),
        ("Two clips.", [], [4, 4]),
    ],
    "forward": [("Hi", [], []), ("What is shown here?", [(40, 40)], [4])],
}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "llava_onevision"])
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def adapter(family) -> ModelAdapter:
    return adapter_for(family.target)


def media(batch: str) -> tuple[list[str], list[list[Any]], list[list[Any]]]:
    """The batch's chat-formatted prompts (for any family's template) and its images and videos per row."""
    rows = BATCHES[batch]
    images = [[sample_image(10 * r + i, size) for i, size in enumerate(sizes)] for r, (_, sizes, _) in enumerate(rows)]
    videos = [[sample_frames(10 * r + i, n) for i, n in enumerate(frames)] for r, (_, _, frames) in enumerate(rows)]
    return [p for p, _, _ in rows], images, videos


def prompts(processor: VisualInputs, batch: str) -> tuple[list[str], list[list[Any]], list[list[Any]]]:
    texts, images, videos = media(batch)
    messages = [chat_messages(t, len(i), len(v)) for t, i, v in zip(texts, images, videos, strict=True)]
    return [processor.apply_chat_template(m) for m in messages], images, videos


def processor_batch(processor: VisualInputs, texts: list[str], images: list[list[Any]]) -> dict[str, Any]:
    """The family's `transformers` processor called on the list of prompts (images given flat, as for one prompt)."""
    flat = [image for row in images for image in row]
    batch = processor.processor(text=texts, images=flat or None, padding=True, padding_side="left", return_tensors="pt")
    return dict(batch)


def singles(processor: VisualInputs, texts, images, videos) -> list[dict[str, Any]]:
    return [dict(processor(t, images=i, videos=v)) for t, i, v in zip(texts, images, videos, strict=True)]


def assert_same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("batch", ["text", "image", "mixed"])
def test_split_rows_of_the_processors_batch_are_each_prompt_alone(family, adapter, batch):
    texts, images, videos = prompts(family.processor, batch)
    rows = adapter.split_rows(processor_batch(family.processor, texts, images))
    assert len(rows) == len(texts)
    for row, single in zip(rows, singles(family.processor, texts, images, videos), strict=True):
        assert_same(row, single)


@pytest.mark.parametrize("batch", ["text", "image", "mixed"])
def test_join_rows_of_single_prompts_is_the_processors_batch(family, adapter, batch):
    texts, images, videos = prompts(family.processor, batch)
    rows = singles(family.processor, texts, images, videos)
    joined = adapter.join_rows(rows, family.processor.tokenizer.pad_token_id)
    assert_same(joined, processor_batch(family.processor, texts, images))


@pytest.mark.parametrize("batch", ["image", "mixed", "video"])
def test_visual_inputs_of_a_list_split_into_each_prompt_alone(family, adapter, batch):
    """The video packer's path (no torchvision needed): each prompt packed alone, then joined."""
    texts, images, videos = prompts(family.processor, batch)
    rows = adapter.split_rows(dict(family.processor(texts, images=images, videos=videos)))
    for row, single in zip(rows, singles(family.processor, texts, images, videos), strict=True):
        assert_same(row, single)


def test_a_split_row_gives_the_logits_of_the_prompt_alone(family, adapter):
    texts, images, videos = prompts(family.processor, "forward")
    rows = adapter.split_rows(dict(family.processor(texts, images=images, videos=videos)))
    with torch.no_grad():
        for row, single in zip(rows, singles(family.processor, texts, images, videos), strict=True):
            ours = family.target(**on_device(row)).logits[0, -1]
            assert torch.equal(ours, family.target(**on_device(single)).logits[0, -1])


def test_split_rows_refuses_visual_tokens_that_are_not_whole_items(family, adapter):
    texts, images, _ = prompts(family.processor, "mixed")
    batch = processor_batch(family.processor, texts, images)
    batch["input_ids"][2, -1] = family.target.config.image_token_id
    with pytest.raises(ValueError, match="not whole items"):
        adapter.split_rows(batch)


def test_split_rows_refuses_a_right_padded_batch(family, adapter):
    texts, images, _ = prompts(family.processor, "mixed")
    flat = [image for row in images for image in row]
    batch = family.processor.processor(text=texts, images=flat, padding=True, padding_side="right", return_tensors="pt")
    with pytest.raises(ValueError, match="not left-padded"):
        adapter.split_rows(dict(batch))


def test_visual_inputs_wants_one_media_list_per_prompt(family):
    texts, images, _ = prompts(family.processor, "image")
    with pytest.raises(ValueError, match="one list of images"):
        family.processor(texts, images=images[:1])


def llava() -> tuple[VisualInputs, LlavaOnevisionAdapter]:
    family = FAMILIES["llava_onevision"]
    return family.processor, adapter_for(family.target)


def test_llava_rows_of_nested_images_keep_their_multi_image_group():
    """Images given per prompt (nested) are one group per row: a row of several images gets one view each, and
    `batch_num_images` counts the images of each prompt that has any."""
    processor, adapter = llava()
    texts, images, _ = prompts(processor, "mixed")
    batch = processor.processor(text=texts, images=images, padding=True, padding_side="left", return_tensors="pt")
    assert batch["batch_num_images"].tolist() == [1, 2, 1]
    alone = [
        dict(processor.processor(text=[t], images=[i] if i else None, return_tensors="pt"))
        for t, i in zip(texts, images, strict=True)
    ]
    for row, single in zip(adapter.split_rows(dict(batch)), alone, strict=True):
        assert_same(row, single)
    assert_same(adapter.join_rows(alone, processor.tokenizer.pad_token_id), dict(batch))


def test_llava_rows_may_keep_the_batchs_zero_patches():
    """The batch pads every image's patches with zeros to the batch's most; the model reads only as many as
    `image_sizes` gives each image, so a row keeping the padding gives the logits of the trimmed row."""
    processor, adapter = llava()
    texts, images, _ = prompts(processor, "mixed")
    batch = processor_batch(processor, texts, images)
    row = adapter.split_rows(batch)[2]
    assert row["pixel_values"].shape[1] < batch["pixel_values"].shape[1]
    padded = {**row, "pixel_values": batch["pixel_values"][1:3]}
    model = FAMILIES["llava_onevision"].target
    with torch.no_grad():
        expected = model(**on_device(row)).logits[0, -1]
        assert torch.equal(model(**on_device(padded)).logits[0, -1], expected)


def test_llava_join_rows_refuses_videos_of_different_lengths():
    processor, adapter = llava()
    text = processor.apply_chat_template(chat_messages("Describe the video.", 0, 1))
    rows = [dict(processor(text, videos=[sample_frames(0, n)])) for n in (3, 4)]
    with pytest.raises(ValueError, match="cannot share a batch"):
        adapter.join_rows(rows, processor.tokenizer.pad_token_id)


def test_llava_image_token_counts_are_the_processors():
    """The count of each image's tokens, at LLaVA-OneVision-hf's sizes (384-pixel crops, 36 grids, anyres_max_9)."""
    config = LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", image_size=384, patch_size=14),
        vision_feature_select_strategy="full",
    )
    adapter = LlavaOnevisionAdapter(SimpleNamespace(config=config))
    processor = image_only(LlavaOnevisionProcessor)(
        image_processor=LlavaOnevisionImageProcessorPil(),
        tokenizer=llava_tokenizer(),
        num_image_tokens=729,
        vision_feature_select_strategy="full",
    )
    rng = random.Random(0)
    for height, width in [(rng.randint(8, 4000), rng.randint(8, 4000)) for _ in range(300)]:
        assert adapter.image_tokens([height, width], True) == processor._get_number_of_features(height, width, 384, 384)


@pytest.fixture(scope="module")
def real_processor(family, tmp_path_factory) -> VisualInputs:
    """The family's tiny processor saved and loaded with its `transformers` video processor."""
    path = tmp_path_factory.mktemp(family.name)
    family.processor.save_pretrained(path)
    processor = load_processor(str(path))
    assert processor.video_packer is None
    return processor


@needs_torchvision
def test_a_real_processors_batch_splits_into_each_prompt_alone(family, adapter, real_processor):
    texts, images, videos = prompts(real_processor, "video")
    rows = adapter.split_rows(dict(real_processor(texts, images=images, videos=videos)))
    for row, single in zip(rows, singles(real_processor, texts, images, videos), strict=True):
        assert_same(row, single)


@needs_torchvision
def test_join_rows_of_a_real_processors_prompts_is_its_batch(family, adapter, real_processor):
    texts, images, videos = prompts(real_processor, "video")
    joined = adapter.join_rows(singles(real_processor, texts, images, videos), real_processor.tokenizer.pad_token_id)
    assert_same(joined, dict(real_processor(texts, images=images, videos=videos)))
