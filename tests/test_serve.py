"""`vlmspec serve` through the real `openai` client: every greedy answer is the target's own `generate` on the same chat
and media, whatever else is in flight; streamed, async, concurrent, seeded, stopped, cancelled."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest
from media_files import write_image
from openai import AsyncOpenAI, OpenAI
from serving import RunningServer, image_part, reference, sent, video_part, with_path

from vlmspec.api import load_pair
from vlmspec.demo_models import demo_pair
from vlmspec.serve.app import ServerOptions

pytestmark = pytest.mark.skipif(demo_pair() is None, reason="the bundled demo pair is not installed")

NAME = "vlmspec-demo"
TOKENS = 24


@pytest.fixture(scope="module")
def spec():
    return load_pair().with_options()


@pytest.fixture(scope="module")
def server(spec):
    running = RunningServer(spec.with_options(), ServerOptions(NAME), batch_size=8)
    yield running
    running.close()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    samples = Path(demo_pair()[0]).parent / "samples"
    return {
        "image": samples / "sample.png",
        "video": samples / "sample.mp4",
        "photos": [write_image(root / f"photo{i}.png", size=(56 + 8 * i, 72), seed=i) for i in range(4)],
    }


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def image(path) -> dict:
    return with_path(image_part(path), path)


def video(path) -> dict:
    return with_path(video_part(path), path)


def ask(client: OpenAI, messages, max_tokens: int = TOKENS, **options):
    return client.chat.completions.create(
        model=NAME, messages=sent(messages), max_tokens=max_tokens, temperature=0, **options
    )


def test_models_lists_the_served_name_and_its_context(client):
    (model,) = client.models.list().data
    assert model.id == NAME and model.model_extra["max_model_len"] == 2048


def test_a_text_chat_is_the_targets_own_greedy_answer(client, spec):
    messages = [{"role": "user", "content": "Describe a red square."}]
    answer = ask(client, messages)
    assert answer.choices[0].message.content == reference(spec, messages, TOKENS)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.object == "chat.completion"


def test_an_image_data_url_is_the_targets_own_greedy_answer(client, spec, media):
    messages = user(image(media["image"]), text("Describe the image."))
    answer = ask(client, messages)
    assert answer.choices[0].message.content == reference(spec, messages, TOKENS)
    usage = answer.usage
    assert usage.completion_tokens == TOKENS and usage.total_tokens == usage.prompt_tokens + TOKENS
    speculation = answer.model_extra["vlmspec"]
    assert speculation["steps"] >= 1 and speculation["accepted_draft_tokens"] >= 0
    assert 0 <= speculation["plain_steps"] <= speculation["steps"]


def test_a_video_url_is_sampled_by_the_familys_rule_and_answered_exactly(client, spec, media):
    messages = user(video(media["video"]), text("Describe the video."))
    assert ask(client, messages).choices[0].message.content == reference(spec, messages, TOKENS)


def test_a_video_sent_as_image_frames_anywhere_in_the_text_is_answered_exactly(client, spec, media):
    frames = [image(p) for p in media["photos"]]
    messages = user(text("Frames:"), *frames[:2], text("and then"), *frames[2:], text("What changes?"))
    assert ask(client, messages).choices[0].message.content == reference(spec, messages, TOKENS)


def test_system_and_earlier_turns_go_through_the_chat_template(client, spec, media):
    messages = [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [image(media["image"]), text("What is it?")]},
        {"role": "assistant", "content": "Coloured shapes."},
        {"role": "user", "content": "Which colours?"},
    ]
    assert ask(client, messages).choices[0].message.content == reference(spec, messages, TOKENS)


def test_a_streamed_answer_is_the_same_text_with_usage_last(client, spec, media):
    messages = user(image(media["image"]), text("Describe the image."))
    chunks = list(ask(client, messages, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == reference(spec, messages, TOKENS)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == TOKENS


def test_the_event_stream_ends_with_done(server, media):
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def test_32_concurrent_async_requests_of_mixed_media_each_get_their_own_greedy_answer(server, spec, media):
    prompts = ["Describe it.", "What colours are there?", "Where is the largest shape?", "Name one shape."]
    chats = []
    for i in range(32):
        prompt = text(prompts[i % 4])
        kind = i % 4
        if kind == 0:
            chats.append(user(image(media["photos"][i % 3]), prompt))
        elif kind == 1:
            chats.append(user(video(media["video"]), prompt))
        elif kind == 2:
            chats.append([{"role": "user", "content": prompts[i % 4]}])
        else:
            chats.append(user(image(media["image"]), image(media["photos"][3]), prompt))
    lengths = [8 + (i * 5) % 17 for i in range(32)]

    async def run_all():
        client = AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
        calls = [
            client.chat.completions.create(model=NAME, messages=sent(m), max_tokens=n, temperature=0)
            for m, n in zip(chats, lengths, strict=True)
        ]
        return await asyncio.gather(*calls)

    answers = asyncio.run(run_all())
    for chat, length, answer in zip(chats, lengths, answers, strict=True):
        assert answer.choices[0].message.content == reference(spec, chat, length)


def test_a_seeded_sampled_request_gives_the_same_answer_every_time(client):
    messages = [{"role": "user", "content": "Tell a story."}]
    first, second = (
        client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=1.0, seed=7)
        for _ in range(2)
    )
    assert first.choices[0].message.content == second.choices[0].message.content


def test_a_stop_string_ends_the_answer_before_it(client, spec, media):
    messages = user(image(media["image"]), text("Describe the image."))
    full = reference(spec, messages, TOKENS)
    stop = full.split()[3]
    answer = ask(client, messages, stop=[stop])
    assert answer.choices[0].message.content == full[: full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, messages, stop=stop, stream=True))
    assert streamed == full[: full.index(stop)]


def test_n_choices_each_decode_the_chat_from_one_prefill(server, client, spec):
    prefills = []

    def count_prompt_forwards(module, args, kwargs) -> None:
        if kwargs.get("logits_to_keep") == 1:
            prefills.append(kwargs["input_ids"].shape[0])

    handle = server.app.state.backend.spec.target.register_forward_pre_hook(count_prompt_forwards, with_kwargs=True)
    messages = [{"role": "user", "content": "Describe a circle."}]
    try:
        answer = ask(client, messages, n=3)
    finally:
        handle.remove()
    assert prefills == [1], "one prompt forward of one row"
    expected = reference(spec, messages, TOKENS)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content == expected for c in answer.choices)
    assert answer.usage.completion_tokens == 3 * TOKENS


def metric(server, pattern: str) -> float:
    found = re.search(pattern, httpx.get(f"{server.base}/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def rows_in_flight(server) -> float:
    return metric(server, r"^vlmspec_rows_in_flight (\S+)$")


def cancelled(server) -> float:
    return metric(server, r'^vlmspec_requests_total\{outcome="cancelled"\} (\S+)$')


@pytest.fixture
def slow_steps(spec):
    """Every target forward takes 50 ms longer, so an answer takes seconds and a client can leave in the middle."""
    hook = spec.target.register_forward_pre_hook(lambda *_: time.sleep(0.05))
    yield
    hook.remove()


def wait_for_no_rows(server) -> None:
    deadline = time.monotonic() + 30
    while rows_in_flight(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows_in_flight(server) == 0


def test_a_client_that_disconnects_mid_stream_frees_its_row(server, client, slow_steps):
    before = cancelled(server)
    stream = ask(client, [{"role": "user", "content": "Tell a story."}], max_tokens=400, stream=True)
    for _ in range(3):
        next(stream)
    assert rows_in_flight(server) == 1
    stream.close()
    wait_for_no_rows(server)
    assert cancelled(server) == before + 1


def test_a_client_that_leaves_before_a_whole_answer_frees_its_row(server, slow_steps):
    before = cancelled(server)
    body = {"model": NAME, "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 400}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/chat/completions", json={**body, "temperature": 0}, timeout=0.6)
    wait_for_no_rows(server)
    assert cancelled(server) == before + 1


def test_health_and_metrics_report_the_server(server, client):
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}
    ask(client, [{"role": "user", "content": "Hi"}], max_tokens=4)
    metrics = httpx.get(f"{server.base}/metrics").text
    for name in (
        'vlmspec_requests_total{outcome="ok"}',
        "vlmspec_completion_tokens_total",
        "vlmspec_queue_length",
        "vlmspec_mean_accepted_length",
        "vlmspec_plain_steps_total",
        "vlmspec_step_seconds_bucket",
        "vlmspec_time_to_first_token_seconds_bucket",
    ):
        assert name in metrics


def test_with_speculation_off_the_targets_generate_answers_a_batch_exactly(spec, media):
    running = RunningServer(spec.with_options(), ServerOptions(NAME), batch_size=4, speculation=False)
    try:
        chats = [user(image(p), text("Describe it.")) for p in media["photos"]]

        async def run_all():
            client = AsyncOpenAI(base_url=running.url, api_key="unused", max_retries=0, timeout=600)
            calls = [
                client.chat.completions.create(model=NAME, messages=sent(m), max_tokens=TOKENS, temperature=0)
                for m in chats
            ]
            return await asyncio.gather(*calls)

        for chat, answer in zip(chats, asyncio.run(run_all()), strict=True):
            assert answer.choices[0].message.content == reference(spec, chat, TOKENS)
    finally:
        running.close()


def test_past_max_queue_a_request_is_refused_at_once_with_503(spec, slow_steps):
    running = RunningServer(spec.with_options(), ServerOptions(NAME, max_queue=2), batch_size=1)
    body = {"model": NAME, "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 400, "n": 2}
    gate = running.app.state.server.gate

    async def run():
        async with httpx.AsyncClient(timeout=120) as http:
            first = asyncio.create_task(http.post(f"{running.url}/chat/completions", json=body))
            deadline = time.monotonic() + 30
            # One choice decodes in the only row (each step slowed), the other waits for it.
            while not (gate.waiting == 1 and rows_in_flight(running) == 1) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            refused = await http.post(f"{running.url}/chat/completions", json=body)
            # Refused at once: the answer comes while the request ahead of it still decodes, not after it.
            ahead_still_decoding = not first.done()
            return await first, refused, ahead_still_decoding

    try:
        answered, refused, ahead_still_decoding = asyncio.run(run())
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded" and ahead_still_decoding
        assert answered.status_code == 200 and len(answered.json()["choices"]) == 2
        assert httpx.get(f"{running.base}/health").status_code == 200
    finally:
        running.close()
