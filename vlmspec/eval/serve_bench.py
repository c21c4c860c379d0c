"""Load on OpenAI-compatible servers: concurrent `openai` clients over a mix of image, video and text chats from the
demo suites, against `vlmspec serve`, the same server with speculation off, `transformers serve` and `vllm serve`
on the same demo target, each started fresh in the same run. Reports requests/s, output tokens/s, time to first
token and time per output token (p50, p99), and checks every answer against the target's own `generate`.

A fault run (`fault_run`) sends 64 concurrent clients at `vlmspec serve`, a tenth of them leaving mid-stream and a
tenth sending malformed requests, and checks that the server stays up, every completed answer is exact, no row stays
in flight and its memory returns to where it was.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .bench import suite_items
from .synthetic import VIDEO_FPS

#: Seconds a server may take to start answering.
START_TIMEOUT = 600
#: Requests in each cell at least (a few clients still send enough for percentiles).
MIN_REQUESTS = 8


@dataclass
class Chat:
    """One request of the workload: OpenAI messages, and the template messages and media the reference uses."""

    kind: str
    messages: list[dict[str, Any]]
    template: list[dict[str, Any]]
    images: list[Any] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)


@dataclass
class Server:
    """A server to start: its command line, environment and the model name its clients send."""

    name: str
    command: list[str]
    model: str
    env: dict[str, str] = field(default_factory=dict)
    why_not: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data_url(data: bytes, kind: str) -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode()


def write_clip(frames: list[Any], path: Path, fps: float = VIDEO_FPS) -> Path:
    """`frames` (PIL images) as an mp4 (PyAV's mpeg4 at a high quality)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=int(fps))
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        stream.options = {"qscale": "1"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_image(frame.convert("RGB"))):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def workload(n: int, folder: Path) -> list[Chat]:
    """`n` distinct chats: held-out image items (2 in 5), video items as mp4 clips (2 in 5) and text questions."""
    from io import BytesIO

    images = suite_items("image", n)
    videos = suite_items("video", n)
    questions = [
        "Describe a picture of coloured shapes on a plain background.",
        "What shapes and colours could a simple scene hold?",
        "Describe a short video of moving coloured shapes.",
    ]
    chats = []
    for i in range(n):
        kind = ("image", "image", "video", "video", "text")[i % 5]
        if kind == "image":
            item = images[i]
            buffer = BytesIO()
            item.image.save(buffer, format="PNG")
            part = {"type": "image_url", "image_url": {"url": _data_url(buffer.getvalue(), "image/png")}}
            content = [part, {"type": "text", "text": item.prompt}]
            template = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": item.prompt}]}]
            chats.append(Chat(kind, [{"role": "user", "content": content}], template, images=[item.image]))
        elif kind == "video":
            item = videos[i]
            path = write_clip(item.frames, folder / f"clip{i}.mp4")
            part = {"type": "video_url", "video_url": {"url": _data_url(path.read_bytes(), "video/mp4")}}
            content = [part, {"type": "text", "text": item.prompt}]
            template = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": item.prompt}]}]
            chats.append(Chat(kind, [{"role": "user", "content": content}], template, videos=[str(path)]))
        else:
            question = questions[i % len(questions)]
            message = [{"role": "user", "content": question}]
            chats.append(Chat(kind, message, message))
    return chats


def references(spec: Any, chats: list[Chat], max_tokens: int) -> list[str]:
    """The target's own greedy answer to each chat (its processor, the family's frame rule, the server's frame cap)."""
    import torch

    from ..processors import load_video

    processor = spec.processor
    answers = []
    for chat in chats:
        clips = [
            load_video(v, sampling=processor.frame_sampling, max_frames=64).padded(processor.min_video_frames)
            for v in chat.videos
        ]
        inputs = processor(processor.apply_chat_template(chat.template), images=chat.images, videos=clips)
        with torch.inference_mode():
            ids = spec.target.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
        answers.append(processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers


def start(server: Server, port: int, log: Path) -> subprocess.Popen:
    command = [str(port) if part == "{port}" else part for part in server.command]
    env = {**os.environ, **server.env}
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(process: subprocess.Popen, base: str, log: Path, timeout: float = START_TIMEOUT) -> float:
    """Seconds until `base`/v1/models answers; raises if the process dies or the time runs out."""
    import httpx

    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the server exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(f"{base}/v1/models", timeout=5).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server did not answer within {timeout:g} s")


def stop(process: subprocess.Popen) -> None:
    """Stop the server and everything it started (engine processes hold memory otherwise)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


@dataclass
class Timed:
    """One streamed request: seconds to its first token, between its first and last, tokens, text, or an error."""

    first: float = float("nan")
    total: float = float("nan")
    tokens: int = 0
    text: str = ""
    error: str | None = None


async def _one(client: Any, model: str, chat: Chat, max_tokens: int, count: Callable[[str], int]) -> Timed:
    timed = Timed()
    started = time.perf_counter()
    last = started
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=chat.messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts = []
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.perf_counter()
                if not parts:
                    timed.first = now - started
                last = now
                parts.append(chunk.choices[0].delta.content)
        timed.text = "".join(parts)
        timed.total = last - started
        timed.tokens = usage.completion_tokens if usage is not None else count(timed.text)
    except Exception as error:  # noqa: BLE001 - a failed request is counted and reported, the load goes on
        timed.error = f"{type(error).__name__}: {error}"
    return timed


async def load(
    base: str, model: str, chats: list[Chat], concurrency: int, requests: int, max_tokens: int, count: Callable
) -> tuple[list[tuple[int, Timed]], float]:
    """`requests` streamed chats (cycling through `chats`) from `concurrency` clients at once; returns each with
    the index of its chat, and the wall time."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base}/v1", api_key=os.environ.get("VLMSPEC_API_KEY", "unused"), timeout=1800)
    queue = list(range(requests))
    done: list[tuple[int, Timed]] = []

    async def worker() -> None:
        while queue:
            i = queue.pop(0)
            done.append((i % len(chats), await _one(client, model, chats[i % len(chats)], max_tokens, count)))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    await client.close()
    return done, wall


def summarise(done: list[tuple[int, Timed]], wall: float, expected: list[str]) -> dict[str, Any]:
    ok = [(i, t) for i, t in done if t.error is None]
    tokens = sum(t.tokens for _, t in ok)
    first = [t.first for _, t in ok if np.isfinite(t.first)]
    per_token = [(t.total - t.first) / (t.tokens - 1) for _, t in ok if t.tokens > 1 and np.isfinite(t.first)]
    return {
        "requests": len(done),
        "failed": len(done) - len(ok),
        "errors": sorted({t.error for _, t in done if t.error})[:3],
        "exact": sum(t.text == expected[i] for i, t in ok),
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": tokens / wall,
        "ttft_p50_ms": 1e3 * float(np.percentile(first, 50)) if first else None,
        "ttft_p99_ms": 1e3 * float(np.percentile(first, 99)) if first else None,
        "tpot_p50_ms": 1e3 * float(np.percentile(per_token, 50)) if per_token else None,
        "tpot_p99_ms": 1e3 * float(np.percentile(per_token, 99)) if per_token else None,
    }


def vlmspec_server(name: str, speculation: bool, batch_size: int) -> Server:
    command = [sys.executable, "-m", "vlmspec.cli", "serve", "--port", "{port}", "--log-level", "warning"]
    command += ["--batch-size", str(batch_size), "--served-model-name", "demo"]
    if not speculation:
        command += ["--speculation", "off"]
    return Server(name, command, "demo")


def peer_servers(target_dir: str, transformers_cli: str | None, vllm_python: str | None) -> list[Server]:
    """`transformers serve` and `vllm serve` (alone, and with its n-gram speculation) on the demo target, where their
    environments are given. vLLM's prefix and media caches are off: the workload repeats its chats, and neither
    vlmspec nor transformers caches a prompt across requests."""
    offline = {"HF_HUB_OFFLINE": "1"}
    servers = []
    if transformers_cli:
        command = [transformers_cli, "serve", target_dir, "--device", "cpu", "--dtype", "float32"]
        command += ["--host", "127.0.0.1", "--port", "{port}"]
        servers.append(Server("transformers serve", command, target_dir, offline))
    else:
        servers.append(Server("transformers serve", [], "", why_not="no transformers CLI given (--transformers-cli)"))
    if vllm_python:
        command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", target_dir]
        command += ["--host", "127.0.0.1", "--port", "{port}", "--dtype", "float32", "--max-model-len", "2048"]
        command += ["--served-model-name", "demo", "--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"]
        env = {**offline, "VLLM_CPU_KVCACHE_SPACE": "4"}
        ngram = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
        servers.append(Server("vllm serve", command, "demo", env))
        servers.append(Server("vllm serve, n-gram", [*command, "--speculative-config", ngram], "demo", env))
    else:
        servers.append(Server("vllm serve", [], "", why_not="no vLLM environment given (--vllm-python)"))
    return servers


def run_serve_bench(
    servers: list[Server],
    chats: list[Chat],
    expected: list[str],
    concurrency: list[int],
    requests_per_client: int,
    max_tokens: int,
    count: Callable[[str], int],
    logs: Path,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every server started fresh in turn, warmed up, then loaded at each concurrency; results by server name."""
    results: dict[str, Any] = {}
    for server in servers:
        if server.why_not is not None:
            results[server.name] = {"skipped": server.why_not}
            continue
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = logs / (re.sub(r"\W+", "-", server.name) + ".log")
        process = None
        try:
            process = start(server, port, log)
            ready = wait_ready(process, base, log)
            progress(f"{server.name}: ready in {ready:.0f} s")
            asyncio.run(load(base, server.model, chats, 2, 4, max_tokens, count))
            cells = {}
            for c in concurrency:
                requests = max(MIN_REQUESTS, c * requests_per_client)
                done, wall = asyncio.run(load(base, server.model, chats, c, requests, max_tokens, count))
                cells[str(c)] = summarise(done, wall, expected)
                progress(f"{server.name} at {c}: {json.dumps(cells[str(c)])}")
            results[server.name] = {"startup_s": ready, "cells": cells}
        except Exception as error:  # noqa: BLE001 - a peer that cannot run is reported, the others go on
            results[server.name] = {"skipped": f"{type(error).__name__}: {error}"[:500]}
            progress(f"{server.name}: {results[server.name]['skipped']}")
        finally:
            if process is not None:
                stop(process)
    return results


def markdown_serve_report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The load table: each server's cells, with ratios against speculation off and against vLLM."""
    lines = [
        f"`{meta['command']}` on {meta['machine']}: {meta['requests_per_client']} streamed greedy requests per "
        f"client (at least {MIN_REQUESTS} a cell), up to {meta['max_tokens']} new tokens, cycling through "
        f"{meta['chats']} chats (2/5 image, 2/5 video mp4, 1/5 text). Exact: answers equal to the target's own "
        "`generate`.",
        "",
        "| server | clients | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | exact | failed |"
        " tok/s vs off | TPOT vs off | tok/s vs vLLM | TPOT vs vLLM |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    off = results.get("speculation off", {}).get("cells", {})
    vllm = results.get("vllm serve", {}).get("cells", {})

    def ratio(a: float | None, b: float | None) -> str:
        return "" if a is None or b is None or b == 0 else f"{a / b:.2f}x"

    for name, result in results.items():
        if "skipped" in result:
            lines.append(f"| {name} | skipped: {result['skipped']} |" + " |" * 10)
            continue
        for c, cell in result["cells"].items():
            base, peer = off.get(c, {}), vllm.get(c, {})
            lines.append(
                f"| {name} | {c} | {cell['requests_per_s']:.2f} | {cell['output_tokens_per_s']:.1f} | "
                f"{_ms(cell['ttft_p50_ms'])} / {_ms(cell['ttft_p99_ms'])} | "
                f"{_ms(cell['tpot_p50_ms'])} / {_ms(cell['tpot_p99_ms'])} | "
                f"{cell['exact']}/{cell['requests'] - cell['failed']} | {cell['failed']} | "
                f"{ratio(cell['output_tokens_per_s'], base.get('output_tokens_per_s'))} | "
                f"{ratio(cell['tpot_p50_ms'], base.get('tpot_p50_ms'))} | "
                f"{ratio(cell['output_tokens_per_s'], peer.get('output_tokens_per_s'))} | "
                f"{ratio(cell['tpot_p50_ms'], peer.get('tpot_p50_ms'))} |"
            )
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def rss_kb(pid: int) -> int:
    """Resident memory of a process and its children, in kB (Linux)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        status = Path(f"/proc/{p}/status")
        if status.exists():
            match = re.search(r"VmRSS:\s+(\d+)", status.read_text())
            total += int(match.group(1)) if match else 0
    return total


async def _faulty(base: str, model: str, chat: Chat, max_tokens: int, role: str, index: int) -> tuple[str, str | None]:
    """One client of the fault run: `ok` reads its answer, `leave` disconnects after two chunks, `bad` sends a
    malformed request; returns its role and its answer (None: none expected)."""
    import httpx

    async with httpx.AsyncClient(timeout=1800) as http:
        url = f"{base}/v1/chat/completions"
        if role == "bad":
            bodies = [b'{"model": "demo", "messages": [', json.dumps({"model": "demo", "messages": []}).encode()]
            response = await http.post(url, content=bodies[index % 2])
            return role, f"status {response.status_code}"
        body = {"model": model, "messages": chat.messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        async with http.stream("POST", url, json=body) as response:
            parts, chunks = [], 0
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks += 1
                if role == "leave" and chunks == 2:
                    return role, None
                event = json.loads(line[6:])
                if event.get("choices") and event["choices"][0]["delta"].get("content"):
                    parts.append(event["choices"][0]["delta"]["content"])
            return role, "".join(parts)


def fault_run(
    chats: list[Chat], expected: list[str], max_tokens: int, logs: Path, clients: int = 64, batch_size: int = 32
) -> dict[str, Any]:
    """64 concurrent clients at a fresh `vlmspec serve`: a tenth leave mid-stream, a tenth send malformed requests."""
    import httpx

    server = vlmspec_server("vlmspec serve", True, batch_size)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = logs / "fault-run.log"
    process = start(server, port, log)
    try:
        wait_ready(process, base, log)
        # The same load without faults first: the caches and buffers a full batch needs are then allocated.
        asyncio.run(load(base, "demo", chats, clients, clients, max_tokens, len))
        before = rss_kb(process.pid)
        roles = ["leave" if i % 10 == 3 else "bad" if i % 10 == 7 else "ok" for i in range(clients)]

        async def everyone():
            calls = [_faulty(base, "demo", chats[i % len(chats)], max_tokens, role, i) for i, role in enumerate(roles)]
            return await asyncio.gather(*calls, return_exceptions=True)

        rounds = []
        for _ in range(2):
            outcomes = asyncio.run(everyone())
            time.sleep(2)
            metrics = httpx.get(f"{base}/metrics").text
            answered = [
                (i, outcome[1])
                for i, outcome in enumerate(outcomes)
                if not isinstance(outcome, BaseException) and outcome[0] == "ok"
            ]
            rounds.append(
                {
                    "answered": len(answered),
                    "exact": sum(text == expected[i % len(chats)] for i, text in answered),
                    "client_errors": sum(isinstance(o, BaseException) for o in outcomes),
                    "health_after": httpx.get(f"{base}/health").status_code,
                    "rows_in_flight_after": float(re.search(r"^vlmspec_rows_in_flight (\S+)$", metrics, re.M).group(1)),
                    "rss_after_mb": rss_kb(process.pid) / 1024,
                }
            )
        return {
            "clients": clients,
            "left": roles.count("leave"),
            "malformed": roles.count("bad"),
            "rss_before_mb": before / 1024,
            "rounds": rounds,
        }
    finally:
        stop(process)


def markdown_fault_report(faults: dict[str, Any]) -> str:
    """The fault run's table: each round's answers, exactness, health, rows left in flight and memory."""
    lines = [
        "",
        f"Fault run: {faults['clients']} concurrent clients, {faults['left']} leaving after two chunks, "
        f"{faults['malformed']} sending malformed requests, twice, after the same load without faults "
        f"(resident memory then: {faults['rss_before_mb']:.0f} MB).",
        "",
        "| round | answered | exact | client errors | /health after | rows in flight after | resident MB after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(faults["rounds"], 1):
        lines.append(
            f"| {i} | {r['answered']} | {r['exact']} | {r['client_errors']} | {r['health_after']} | "
            f"{r['rows_in_flight_after']:.0f} | {r['rss_after_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def temporary_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="vlmspec-serve-bench-"))


def bench_serve(
    concurrency: list[int],
    requests_per_client: int,
    max_tokens: int,
    chats_count: int,
    batch_size: int,
    transformers_cli: str | None,
    vllm_python: str | None,
    out: Path | None,
    fault: bool,
    command: str,
) -> str:
    """The whole load bench on the demo pair (and the fault run with `fault`); returns the report's markdown."""
    import platform

    import torch

    from ..api import load_pair
    from ..demo_models import demo_pair

    pair = demo_pair()
    if pair is None:
        raise ValueError("bench-serve runs on the bundled demo pair, which is not installed")
    folder = temporary_folder()
    logs = folder / "logs"
    logs.mkdir()
    spec = load_pair()
    chats = workload(chats_count, folder)
    expected = references(spec, chats, max_tokens)
    tokenizer = spec.processor.tokenizer

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    servers = [vlmspec_server("vlmspec serve", True, batch_size), vlmspec_server("speculation off", False, batch_size)]
    servers += peer_servers(str(pair[0]), transformers_cli, vllm_python)
    results = run_serve_bench(servers, chats, expected, concurrency, requests_per_client, max_tokens, count, logs)
    meta = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "requests_per_client": requests_per_client,
        "max_tokens": max_tokens,
        "chats": chats_count,
    }
    report = markdown_serve_report(results, meta)
    faults = fault_run(chats, expected, max_tokens, logs, batch_size=batch_size) if fault else None
    if faults is not None:
        report += markdown_fault_report(faults)
    report += f"\nThe servers' logs: {logs}\n"
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(report)
        (out / "results.json").write_text(json.dumps({"meta": meta, "results": results, "faults": faults}, indent=2))
    return report
