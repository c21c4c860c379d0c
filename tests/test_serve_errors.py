"""Bad requests to `vlmspec serve`: each gets OpenAI's error object naming the problem, with OpenAI's status, and the
server goes on answering."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import httpx
import openai
import pytest
from media_files import write_image
from serving import RunningServer

from vlmspec.api import load_pair
from vlmspec.demo_models import demo_pair
from vlmspec.serve.app import ServerOptions
from vlmspec.serve.chat import ServeLimits
from vlmspec.serve.errors import APIError
from vlmspec.serve.media import MediaFetcher, MediaLimits

pytestmark = pytest.mark.skipif(demo_pair() is None, reason="the bundled demo pair is not installed")

NAME = "vlmspec-demo"
KEY = "sekret"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    allowed, outside = root / "allowed", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    write_image(allowed / "photo.png")
    write_image(outside / "secret.png")
    (allowed / "notes.png").write_text("not an image at all")
    os.symlink(outside / "secret.png", allowed / "link.png")
    return allowed, outside


@pytest.fixture(scope="module")
def server(folders):
    options = ServerOptions(
        NAME,
        api_key=KEY,
        max_body_bytes=200_000,
        limits=ServeLimits(max_images=4),
        media=MediaLimits(allowed_local=folders[0]),
    )
    running = RunningServer(load_pair().with_options(), options, batch_size=4)
    yield running
    running.close()


def post(server, body, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{server.url}/chat/completions", content=content, headers=headers, timeout=120)


def chat(*parts, **fields) -> dict:
    content = list(parts) or "Hi"
    return {"model": NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def inline(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def refused(response: httpx.Response, status: int, *, param: str | None = None, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error["message"]


IMAGE_URL = "messages[0].content[0].image_url.url"


def test_malformed_json_is_refused(server):
    assert "not valid JSON" in refused(post(server, None, raw=b'{"model": '), 400, code="invalid_json")


def test_a_request_without_messages_is_refused(server):
    refused(post(server, {"model": NAME}), 400, param="messages")
    refused(post(server, {"model": NAME, "messages": []}), 400, param="messages")


def test_an_unknown_model_is_not_found(server):
    message = refused(post(server, {**chat(), "model": "gpt-9"}), 404, param="model", code="model_not_found")
    assert "gpt-9" in message and NAME in message


def test_an_unreachable_media_url_is_refused(server):
    message = refused(post(server, chat(image("http://127.0.0.1:9/photo.png"))), 400, param=IMAGE_URL)
    assert "could not fetch" in message


def test_an_undecodable_inline_image_is_refused(server):
    message = refused(post(server, chat(image(inline(b"these bytes are no picture")))), 400, param=IMAGE_URL)
    assert "not a readable image" in message
    refused(post(server, chat(image("data:image/png;base64,@@@not-base64@@@"))), 400, param=IMAGE_URL)


def test_a_file_that_is_not_an_image_is_refused(server, folders):
    url = (folders[0] / "notes.png").as_uri()
    assert "not a readable image" in refused(post(server, chat(image(url))), 400, param=IMAGE_URL)


def test_an_allowed_local_image_is_read(server, folders):
    response = post(server, chat(image((folders[0] / "photo.png").as_uri()), {"type": "text", "text": "Describe."}))
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4


def test_a_path_that_climbs_out_of_the_allowed_folder_is_forbidden(server, folders):
    url = "file://" + str(folders[0]) + "/../outside/secret.png"
    assert "outside the allowed media folder" in refused(post(server, chat(image(url))), 403, param=IMAGE_URL)


def test_a_symlink_out_of_the_allowed_folder_is_forbidden(server, folders):
    url = (folders[0] / "link.png").as_uri()
    refused(post(server, chat(image(url))), 403, param=IMAGE_URL)


def test_local_files_are_refused_unless_a_folder_is_allowed(folders):
    fetcher = MediaFetcher(MediaLimits())
    with pytest.raises(APIError, match="--allowed-local-media-path") as caught:
        fetcher.image((folders[0] / "photo.png").as_uri(), "url")
    assert caught.value.status == 400


def test_too_many_images_are_refused(server, folders):
    url = (folders[0] / "photo.png").as_uri()
    message = refused(post(server, chat(*[image(url)] * 5)), 400, param="messages")
    assert "5 images" in message and "4" in message


def test_a_prompt_too_long_for_the_context_is_refused(server):
    message = refused(post(server, chat(max_tokens=5000)), 400, code="context_length_exceeded")
    assert "2048" in message


def test_max_tokens_below_one_is_refused(server):
    refused(post(server, chat(max_tokens=0)), 400, param="max_tokens")
    refused(post(server, chat(max_completion_tokens=-3)), 400, param="max_completion_tokens")


def test_out_of_range_sampling_fields_are_refused_naming_them(server):
    refused(post(server, chat(temperature=5)), 400, param="temperature")
    refused(post(server, chat(top_p=0)), 400, param="top_p")
    refused(post(server, chat(logprobs=True)), 400, param="logprobs", code="unsupported_parameter")


def test_an_oversized_body_is_refused_with_413(server):
    big = inline(b"\0" * 300_000)
    refused(post(server, chat(image(big))), 413, code="too_large")


def test_a_wrong_or_missing_api_key_is_refused_with_401(server):
    refused(post(server, chat(), key="wrong"), 401, code="invalid_api_key")
    refused(post(server, chat(), key=None), 401, code="invalid_api_key")
    assert httpx.get(f"{server.url}/models").status_code == 401


def test_the_openai_client_raises_its_own_errors(server):
    client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()


def test_after_every_refusal_the_server_still_answers(server):
    refused(post(server, None, raw=b"{"), 400)
    refused(post(server, chat(max_tokens=0)), 400)
    response = post(server, chat())
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]
    assert httpx.get(f"{server.base}/health").json() == {"status": "ok"}
    metrics = httpx.get(f"{server.base}/metrics").text
    assert 'vlmspec_requests_total{outcome="invalid"}' in metrics


def test_a_file_url_must_name_this_machine(folders):
    fetcher = MediaFetcher(MediaLimits(allowed_local=Path(folders[0])))
    with pytest.raises(APIError, match="local path"):
        fetcher.image("file://example.com/photo.png", "url")


def test_a_host_outside_the_allowed_media_domains_is_forbidden():
    fetcher = MediaFetcher(MediaLimits(allowed_domains=frozenset({"images.example.com"})))
    with pytest.raises(APIError, match="not an allowed media domain") as caught:
        fetcher.image("http://169.254.169.254/latest/meta-data", "url")
    assert caught.value.status == 403


def test_an_unparseable_url_is_bad_input_not_a_server_error():
    fetcher = MediaFetcher(MediaLimits(allowed_local=Path("/tmp")))
    for url in ("http://[::1/x", "file:///tmp/a%00b.png"):
        with pytest.raises(APIError) as caught:
            fetcher.image(url, "url")
        assert caught.value.status == 400


def test_too_many_videos_are_refused(server):
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    message = refused(post(server, chat(*[video] * 5)), 400, param="messages")
    assert "5 videos" in message


def test_an_unknown_route_gets_the_error_object(server):
    response = httpx.get(f"{server.url}/completions/nowhere")
    assert response.status_code == 404 and set(response.json()["error"]) == {"message", "type", "param", "code"}
