"""The server's parts that need no model: reading a chat request, the text a stream may send, the queue's gate."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from vlmspec.demo_models import demo_pair
from vlmspec.serve.app import _Gate
from vlmspec.serve.chat import ServeLimits, parse_chat
from vlmspec.serve.errors import APIError
from vlmspec.serve.metrics import ServerMetrics
from vlmspec.serve.text import TextStream


class Characters:
    """A tokenizer whose token i is the character chr(i); 0xFFFD stands for half of a split character."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def body(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}


def test_a_stream_sends_text_as_it_arrives_without_stops():
    stream = TextStream(Characters(), [])
    assert stream.feed(ids("Hel")) == "Hel" and stream.feed(ids("lo")) == "lo" and stream.finish() == ""


def test_a_stream_holds_back_what_could_begin_a_stop_string_and_cuts_before_it():
    stream = TextStream(Characters(), ["END"])
    assert stream.feed(ids("abcE")) == "abc"
    assert stream.feed(ids("N")) == ""
    assert stream.feed(ids("D and more")) == "" and stream.stopped
    assert stream.feed(ids("xyz")) == "" and stream.finish() == ""


def test_held_back_text_that_is_no_stop_is_sent_at_the_end():
    stream = TextStream(Characters(), ["END"])
    assert stream.feed(ids("abEN")) == "ab" and stream.feed(ids("x")) == "ENx"
    assert stream.finish() == "" and not stream.stopped


def test_text_ending_inside_a_character_waits_for_the_tokens_that_complete_it():
    stream = TextStream(Characters(), [])
    assert stream.feed(ids("ok") + [0xFFFD]) == ""
    assert stream.feed(ids("!")) == "ok\ufffd!"


@pytest.mark.skipif(demo_pair() is None, reason="the bundled demo pair is not installed")
def test_streamed_pieces_of_a_real_tokenizer_join_into_its_whole_decoding():
    tokenizer = AutoTokenizer.from_pretrained(demo_pair()[0])
    text = "We see a red triangle: héllo wörld ✓ 日本語, then more words."
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, [])
    pieces = [stream.feed([token]) for token in tokens] + [stream.finish()]
    assert "".join(pieces) == tokenizer.decode(tokens, skip_special_tokens=True)
    assert all("\ufffd" not in piece for piece in pieces)


def test_a_chat_becomes_template_messages_with_media_in_place():
    parts = [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        {"type": "text", "text": "What changes?"},
    ]
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}]
    chat = parse_chat(body(messages=messages), ServeLimits(), None)
    assert chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert [p["type"] for p in chat.messages[1]["content"]] == ["text", "image", "video", "text"]
    assert [(kind, param) for kind, _, param in chat.media] == [
        ("image", "messages[1].content[1].image_url.url"),
        ("video", "messages[1].content[2].video_url.url"),
    ]


def test_sampling_fields_become_generate_arguments():
    chat = parse_chat(body(temperature=0.7, top_p=0.9, top_k=5, stop="###", max_tokens=9, seed=4), ServeLimits(), None)
    assert chat.options == {
        "max_new_tokens": 9,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "stop_strings": ["###"],
    }
    assert chat.seed == 4 and parse_chat(body(temperature=0), ServeLimits(), None).options["do_sample"] is False


def test_max_tokens_comes_from_the_config_then_the_servers_default():
    assert parse_chat(body(), ServeLimits(default_max_tokens=77), None).max_new_tokens == 77
    assert parse_chat(body(), ServeLimits(default_max_tokens=77), 40).max_new_tokens == 40
    assert parse_chat(body(max_completion_tokens=5, max_tokens=9), ServeLimits(), 40).max_new_tokens == 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"top_k": "5"}, "top_k"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"num_frames": 4, "fps": 1.0}, "num_frames"),
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "audio_url"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"model": None}, "model"),
    ],
)
def test_a_bad_field_is_refused_naming_it(fields, param):
    with pytest.raises(APIError) as caught:
        parse_chat(body(**fields), ServeLimits(), None)
    assert caught.value.status == 400 and caught.value.param == param


def test_images_past_the_limit_are_refused():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(APIError, match="3 images"):
        parse_chat(body(messages=[{"role": "user", "content": [image] * 3}]), ServeLimits(max_images=2), None)


def test_the_gate_admits_choices_up_to_its_limit_and_reopens_as_they_leave():
    gate = _Gate(3, ServerMetrics())
    assert gate.enter(2) and not gate.enter(2) and gate.enter(1)
    gate.leave(2)
    assert gate.enter(2) and gate.waiting == 3
