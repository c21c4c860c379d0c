"""`vlmspec.pipeline` is a drop-in for `transformers.pipeline("image-text-to-text")`."""

from __future__ import annotations

import pytest
import transformers
from conftest import on_device

import vlmspec
from vlmspec.testing import sample_frames, sample_image


@pytest.fixture(scope="module")
def pipelines(qwen):
    reference = transformers.pipeline("image-text-to-text", model=qwen.target, processor=qwen.processor.processor)
    ours = vlmspec.pipeline(
        "image-text-to-text", model=qwen.target, draft_model=qwen.drafts["noisy"], processor=qwen.processor
    )
    return reference, ours


def test_images_and_text_give_the_same_output(pipelines):
    reference, ours = pipelines
    kwargs = dict(
        images=sample_image(0), text="<|vision_start|><|image_pad|><|vision_end|>Describe.", max_new_tokens=20
    )
    assert ours(**kwargs) == reference(**kwargs)


@pytest.mark.parametrize("return_full_text", [True, False])
def test_chat_messages_give_the_same_output(pipelines, return_full_text):
    reference, ours = pipelines
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": sample_image(1)},
                {"type": "text", "text": "Describe the image in detail."},
            ],
        }
    ]
    kwargs = dict(text=messages, max_new_tokens=20, return_full_text=return_full_text)
    assert ours(**kwargs) == reference(**kwargs)


def test_video_in_chat_messages_is_answered_like_the_target(pipelines, qwen):
    _, ours = pipelines
    frames = sample_frames(0, num_frames=4)
    messages = [
        {
            "role": "user",
            "content": [{"type": "video", "video": frames}, {"type": "text", "text": "Describe the video."}],
        }
    ]
    out = ours(text=messages, max_new_tokens=16, return_full_text=False)
    inputs = qwen.processor(
        qwen.processor.apply_chat_template(vlmspec.processors.chat_messages("Describe the video.", 0, 1)),
        videos=[frames],
    )
    ids = qwen.target.generate(**on_device(inputs), do_sample=False, max_new_tokens=16)
    expected = qwen.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert out[0]["generated_text"] == expected


def test_other_tasks_are_refused():
    with pytest.raises(ValueError, match="image-text-to-text"):
        vlmspec.pipeline("text-generation", model="x", draft_model="y")


def test_generation_settings_given_to_the_call_reach_generate(pipelines, qwen):
    _, ours = pipelines
    text = "<|vision_start|><|image_pad|><|vision_end|>Describe."
    out = ours(images=sample_image(0), text=text, max_new_tokens=16, return_full_text=False, repetition_penalty=1.5)
    inputs = qwen.processor(text, images=[sample_image(0)])
    ids = qwen.target.generate(**on_device(inputs), do_sample=False, max_new_tokens=16, repetition_penalty=1.5)
    expected = qwen.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    plain = ours(images=sample_image(0), text=text, max_new_tokens=16, return_full_text=False)
    assert out[0]["generated_text"] == expected != plain[0]["generated_text"]


def test_a_list_at_batch_size_above_one_gives_every_inputs_own_output_in_order(pipelines):
    reference, ours = pipelines
    chats = [
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": sample_image(i, (64 + 16 * i, 96))},
                    {"type": "text", "text": "Describe." * (i + 1)},
                ],
            }
        ]
        for i in range(5)
    ]
    expected = reference(text=chats, max_new_tokens=12, batch_size=1)
    assert ours(text=chats, max_new_tokens=12, batch_size=2) == expected
