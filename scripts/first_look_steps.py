"""The sub-steps of the GPU first look (`scripts/first_look.py`): each a command of the project run under a time limit
in its own folder, and a reader that turns what it wrote into markdown and numbers.

`python scripts/first_look_steps.py environment FOLDER` is the first sub-step's own command: it writes what the
machine is (GPU, driver, torch, transformers, the carried wheels, the size of the tree that travelled).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Wall seconds of the whole first look at its full settings; the sub-steps' own seconds add up to it.
BUDGET = 480.0
#: A sub-step given fewer seconds than this is skipped (recorded as such).
LEAST_SECONDS = 5.0
EXACTNESS_FILES = (
    "tests/test_exactness.py",
    "tests/test_batch.py",
    "tests/test_replicas.py",
    "tests/test_compiled.py",
    "tests/test_head_decoding.py",
)
#: The one exactness case `--quick` runs: a partly accepted draft's chain on an image, token for token.
QUICK_EXACTNESS_CASE = (
    "tests/test_exactness.py::test_greedy_output_equals_target_generate[qwen2_5_vl-image-noisy-chain]"
)
_FALLBACK_SIGNS = ("compiled decoding is off for this pair", "runs eager:")


@dataclass(frozen=True)
class Settings:
    """Where the sub-steps run and write, at which settings, within how many seconds in all."""

    work: Path
    device: str
    quick: bool
    budget: float


@dataclass(frozen=True)
class SubStep:
    """One sub-step: `argv(settings, folder)` is its command; `read(folder, output)` turns what it wrote into
    (markdown, numbers); `seconds` is its own share of the budget (None: whatever is left)."""

    name: str
    what: str
    seconds: float | None
    argv: Callable[[Settings, Path], list[str]]
    read: Callable[[Path, str], tuple[str, dict]]


def run_sub_step(step: SubStep, settings: Settings, limit: float) -> tuple[dict, str]:
    """Run `step` within `limit` seconds (its whole process group is killed past it); returns its record and its
    output. A sub-step with too little time is skipped; one whose results cannot be read is recorded as failed."""
    folder = settings.work / step.name
    folder.mkdir(parents=True, exist_ok=True)
    argv = step.argv(settings, folder)
    record = {"name": step.name, "what": step.what, "command": " ".join(argv), "limit": round(limit, 1)}
    record |= {"seconds": 0.0, "exit_code": None, "markdown": "", "results": None}
    if limit < LEAST_SECONDS:
        return record | {"status": "skipped: no time left"}, ""
    started = time.monotonic()
    output_file = folder / "output.txt"
    with open(output_file, "w") as output:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
        process = subprocess.Popen(
            argv, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            process.wait(timeout=limit)
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = "timed out"
    record |= {"seconds": round(time.monotonic() - started, 1), "exit_code": process.returncode, "status": status}
    text = output_file.read_text(errors="replace")
    try:
        record["markdown"], record["results"] = step.read(folder, text)
    except (OSError, ValueError, KeyError, TypeError, ElementTree.ParseError) as error:
        record["markdown"] = f"Nothing readable was written ({type(error).__name__}: {error})."
        if status == "ok":
            record["status"] = "failed (no results)"
    return record, text


def _vlmspec(*args: str) -> list[str]:
    return [sys.executable, "-m", "vlmspec.cli", *args]


def _demo(compile: str, methods: str) -> Callable[[Settings, Path], list[str]]:
    def argv(settings: Settings, folder: Path) -> list[str]:
        sizes = ["--n", "1", "--max-new-tokens", "4"] if settings.quick else ["--n", "8", "--max-new-tokens", "128"]
        command = _vlmspec("bench", "--suite", "image", "--methods", methods, *sizes, "--device", settings.device)
        return [*command, "--compile", compile, "--out", str(folder)]

    return argv


def _costs(pair: str) -> Callable[[Settings, Path], list[str]]:
    def argv(settings: Settings, folder: Path) -> list[str]:
        command = [sys.executable, "scripts/step_costs.py", "--pairs", pair, "--device", settings.device]
        command += ["--out", str(folder / "results.json"), "--no-assisted"]
        if settings.quick:
            command += ["--scale", "tiny", "--dtype", "float32", "--contexts", "32", "--nodes", "1,4"]
            return [*command, "--widths", "1,2", "--new-tokens", "4", "--repeats", "1"]
        command += ["--compile", "on", "--contexts", "8192", "--nodes", "1,4,16,64", "--widths", "1,4,16"]
        return [*command, "--new-tokens", "16", "--repeats", "2"]

    return argv


def _profile(settings: Settings, folder: Path) -> list[str]:
    command = _vlmspec("profile", "--device", settings.device, "--batch-size", "1,16", "--out", str(folder))
    return (
        [*command, "--max-new-tokens", "8", "--policies", "chain"]
        if settings.quick
        else [*command, "--max-new-tokens", "32"]
    )


def _exactness(settings: Settings, folder: Path) -> list[str]:
    command = [sys.executable, "-m", "pytest", "--device", settings.device, "-x", "-p", "no:cacheprovider"]
    command += [f"--junitxml={folder / 'junit.xml'}", "-p", "no:warnings"]
    if settings.quick:
        return [*command, QUICK_EXACTNESS_CASE]
    return [*command, "-n", "8", "--dist", "loadfile", *EXACTNESS_FILES]


def _environment(settings: Settings, folder: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "environment", str(folder)]


def read_results(folder: Path, output: str) -> tuple[str, dict]:
    """A command that writes results.md and results.json (`vlmspec bench`, `vlmspec profile`, the environment)."""
    return (folder / "results.md").read_text(), json.loads((folder / "results.json").read_text())


def read_bench(folder: Path, output: str) -> tuple[str, dict]:
    """`vlmspec bench`'s table, its per-method summary, and whether vlmspec's forwards ran compiled or fell back."""
    results = json.loads((folder / "results.json").read_text())
    kept = ("suite", "n", "max_new_tokens", "machine", "device", "compiled", "warm_up_seconds", "methods")
    numbers = {key: results[key] for key in kept}
    fallbacks = [line.strip() for line in output.splitlines() if any(sign in line for sign in _FALLBACK_SIGNS)]
    numbers["fallbacks"] = fallbacks
    numbers["compiled_path"] = compiled_path(results["compiled"], results["device"], fallbacks)
    markdown = (folder / "results.md").read_text()
    return f"Compiled path: {numbers['compiled_path']}\n\n{markdown}", numbers


def compiled_path(compiled: bool, device: str, fallbacks: list[str]) -> str:
    """Whether vlmspec's forwards ran compiled, in words: ran, fell back (with the warnings that say why), or eager."""
    if fallbacks:
        return "fell back to eager: " + " / ".join(fallbacks)
    if compiled:
        return "ran compiled (no fallback)"
    if not device.startswith("cuda"):
        return f"eager: compile='auto' compiles on CUDA only, and this ran on {device}"
    return "eager"


def read_costs(folder: Path, output: str) -> tuple[str, dict]:
    """`scripts/step_costs.py`'s printed tables when it finished, else what its JSON held when it stopped."""
    numbers = json.loads((folder / "results.json").read_text())
    if "Projection" in output:
        return output[output.index("## ") :], numbers
    lines = ["Stopped before its tables; what it had measured:", ""]
    for pair, result in numbers["pairs"].items():
        for context, row in result["contexts"].items():
            measured = ", ".join(f"{key} {value}" for key, value in row.items())
            lines.append(f"- {pair}, context {context}: {measured}")
        lines += [f"- {pair}, own ms per step: {result['own_ms_per_step']}"]
    return "\n".join(lines), numbers


def read_junit(folder: Path, output: str) -> tuple[str, dict]:
    """Passed, failed, errors and skipped from pytest's JUnit XML, with the first failure's test and message."""
    root = ElementTree.parse(folder / "junit.xml").getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(getattr(outcome, "tag", ""), "passed")
        counts[key] += 1
        if key in ("failed", "errors"):
            message = (outcome.get("message") or "").splitlines()[:3]
            counts["failures"].append({"test": f"{case.get('classname')}::{case.get('name')}", "message": message})
    lines = ["| passed | failed | errors | skipped |", "| --- | --- | --- | --- |"]
    lines.append(f"| {counts['passed']} | {counts['failed']} | {counts['errors']} | {counts['skipped']} |")
    for failure in counts["failures"]:
        lines += ["", f"- `{failure['test']}`: {' '.join(failure['message'])[:400]}"]
    return "\n".join(lines), counts


STEPS = [
    SubStep(
        "environment",
        "The machine: GPU, driver, torch, transformers, the carried wheels, the tree that travelled.",
        15,
        _environment,
        read_results,
    ),
    SubStep(
        "demo-eager",
        "The demo pair on the image suite: plain generate, ar-compiled and vlmspec's default, eager.",
        75,
        _demo("off", "ar,ar-compiled,auto"),
        read_bench,
    ),
    SubStep(
        "demo-compiled",
        "vlmspec's default with compile='auto' beside plain generate: ran compiled, or fell back.",
        150,
        _demo("auto", "ar,auto"),
        read_bench,
    ),
    SubStep(
        "costs-llava_onevision",
        "LLaVA-OneVision-7B + 0.5B at the released sizes, bf16, compiled: step costs "
        "and the projection at the SAGE paper's tau.",
        140,
        _costs("llava_onevision"),
        read_costs,
    ),
    SubStep(
        "profile", "vlmspec profile at B=1 and B=16: launches and host reads per step.", 50, _profile, read_results
    ),
    SubStep(
        "exactness",
        "The exactness test files on the device, stopping at the first failure.",
        50,
        _exactness,
        read_junit,
    ),
    SubStep(
        "costs-qwen2_5_vl",
        "Qwen2.5-VL-7B + 3B and a released-shape head at the released sizes, bf16, compiled, with what time is left.",
        None,
        _costs("qwen2_5_vl"),
        read_costs,
    ),
]


def environment() -> dict:
    """What this machine is and what it runs, as far as it can tell."""
    import torch
    import transformers
    from carry_size import sizes

    info = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__}
    info |= {"cuda": torch.version.cuda, "transformers": transformers.__version__}
    info["transformers_from"] = str(Path(transformers.__file__).parent.parent)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        info["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as error:
        info["nvidia_smi"] = f"not available ({type(error).__name__})"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    info["carried"] = {w.name: w.stat().st_size for w in wheels}
    info["travelled_bytes"] = sizes(ROOT, [".whl"] if wheels else [])["total_bytes"]
    return info


def environment_markdown(info: dict) -> str:
    carried = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in info["carried"].items()) or "nothing"
    return (
        f"- GPU: {info.get('gpu', 'none visible to torch')}; nvidia-smi: {info['nvidia_smi'] or 'nothing'}\n"
        f"- torch {info['torch']} (CUDA {info['cuda']}), triton {info['triton']}, transformers {info['transformers']} "
        f"(from {info['transformers_from']}), Python {info['python']} on {info['platform']}\n"
        f"- carried: {carried}; travelled in all: {info['travelled_bytes'] / 2**20:.1f} MiB\n"
    )


if __name__ == "__main__" and sys.argv[1:2] == ["environment"]:
    folder = Path(sys.argv[2])
    described = environment()
    (folder / "results.json").write_text(json.dumps(described, indent=1))
    (folder / "results.md").write_text(environment_markdown(described))
