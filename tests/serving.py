"""A `vlmspec serve` application running in this process (uvicorn on a free port, on a thread of its own), and the
references its answers are held to: the target's own `generate` on the same chat through its own processor."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from vlmspec.eval.serve_bench import Chat, references
from vlmspec.processors import load_image
from vlmspec.serve.app import ServerOptions
from vlmspec.serve.launch import build_app
from vlmspec.speculative import SpeculativeVLM


class RunningServer:
    """`build_app(spec, options, ...)` served at `self.url` until `close()`."""

    def __init__(self, spec: SpeculativeVLM, options: ServerOptions, **backend: Any):
        self.app = build_app(spec, options, **backend)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def data_url(path: Path | str, kind: str) -> str:
    suffix = Path(path).suffix.lstrip(".").lower()
    return f"data:{kind}/{suffix};base64," + base64.b64encode(Path(path).read_bytes()).decode()


def image_part(path: Path | str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(path, "image")}}


def video_part(path: Path | str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": data_url(path, "video")}}


def template_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Path], list[Path]]:
    """OpenAI messages as the chat template takes them, with the media files they carry (test parts name their file
    in a `path` key beside the URL)."""
    out, images, videos = [], [], []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            out.append(message)
            continue
        parts = []
        for part in content:
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
            elif part["type"] == "image_url":
                images.append(part["path"])
                parts.append({"type": "image"})
            else:
                videos.append(part["path"])
                parts.append({"type": "video"})
        out.append({"role": message["role"], "content": parts})
    return out, images, videos


def sent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a client sends them (without the test's `path` keys)."""
    return [
        {**m, "content": [{k: v for k, v in p.items() if k != "path"} for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


def with_path(part: dict[str, Any], path: Path | str) -> dict[str, Any]:
    return {**part, "path": path}


def reference(spec: SpeculativeVLM, messages: list[dict[str, Any]], max_new_tokens: int) -> str:
    """The target's own greedy `generate` on the chat (the load bench's reference: its processor on the template's
    text and the decoded media, videos sampled by the family's rule up to the server's default of 64 frames)."""
    chat, images, videos = template_messages(messages)
    item = Chat("test", messages, chat, [load_image(i) for i in images], [str(v) for v in videos])
    return references(spec, [item], max_new_tokens)[0]
