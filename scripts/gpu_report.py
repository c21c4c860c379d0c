"""Every figure vlmspec publishes for a GPU, in parts of under 9 minutes each, as markdown and JSON.

Each part runs one or more commands of the project (the test suite, `vlmspec bench`, `vlmspec profile`,
`scripts/step_costs.py`, `scripts/bf16_agreement.py`), each writing `results.md` and `results.json` into its own
folder `OUTDIR/<step>/`, with its output in `log.txt` beside them. `OUTDIR/summary.md` and `summary.json` say, for
every part run so far (a later run of a part replaces its entry), whether it passed, its commands, their exit codes
and seconds. A part whose command fails or runs past the time limit is recorded as failed, the other parts named go
on, and the run exits 1; bad arguments exit 2.

Usage (normally through scripts/gpu_report.sh, which sets up .venv first):
    python scripts/gpu_report.py OUTDIR [PART ...]      no PART: every part, in order
    python scripts/gpu_report.py --list                  the parts and what each measures
`--device` (default cuda) is where everything runs; `--quick` runs every part at its smallest settings (one item, a
few tokens, tiny model sizes, one model-free test file), to check that the parts run anywhere, `--device cpu`
included: its numbers are no figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Seconds one part may run before it is stopped and recorded as failed.
PART_LIMIT = 540
PAIRS = ("qwen2_5_vl", "qwen3_vl", "llava_onevision")
BENCH_SUITES = ("image", "video", "long-video")
BENCH_METHODS = "ar,ar-compiled,hf-assisted,chain,sage,sage-gt"
BATCH_SIZES = "1,4,8,16,32,64"
QUANT_METHODS = "ar,hf-assisted,chain,sage,sage-gt"


@dataclass(frozen=True)
class Settings:
    """Where the parts run, how big they are, and where they write."""

    out: Path
    device: str
    quick: bool
    workers: int


@dataclass(frozen=True)
class Step:
    """One command of a part: it writes into `OUTDIR/<name>/`; `markdown_from_stdout` when the command prints its
    tables instead of writing results.md, `junit` when it is the test suite (counted from its JUnit XML)."""

    name: str
    argv: list[str]
    markdown_from_stdout: bool = False
    junit: bool = False


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    steps: Callable[[Settings], list[Step]]


def _python() -> list[str]:
    return [sys.executable]


def _vlmspec(*args: str) -> list[str]:
    return [sys.executable, "-m", "vlmspec.cli", *args]


def _suite(compiled: bool) -> Callable[[Settings], list[Step]]:
    def steps(s: Settings) -> list[Step]:
        name = "suite-compiled" if compiled else "suite-eager"
        junit = s.out / name / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "--device", s.device, "-p", "no:cacheprovider", f"--junitxml={junit}"]
        # A file that cannot be imported (a package the machine lacks) is counted as an error; the rest still run.
        argv += ["--continue-on-collection-errors"]
        argv += ["--compile", "on" if compiled else "off"]
        argv += ["tests/test_tree.py"] if s.quick else ["-n", str(s.workers), "--dist", "loadfile"]
        return [Step(name, argv, junit=True)]

    return steps


def _bf16(s: Settings) -> list[Step]:
    sizes = ["--n", "2", "--max-new-tokens", "4"] if s.quick else ["--n", "24", "--max-new-tokens", "32"]
    argv = [*_python(), "scripts/bf16_agreement.py", "--device", s.device, *sizes, "--out", str(s.out / "bf16")]
    return [Step("bf16", argv)]


def _costs(pair: str, compiled: bool) -> Callable[[Settings], list[Step]]:
    def steps(s: Settings) -> list[Step]:
        name = f"costs-{pair}-{'compiled' if compiled else 'eager'}"
        argv = [*_python(), "scripts/step_costs.py", "--pairs", pair, "--device", s.device]
        argv += ["--compile", "on" if compiled else "off", "--out", str(s.out / name / "results.json")]
        if s.quick:
            argv += ["--scale", "tiny", "--dtype", "float32", "--contexts", "32", "--nodes", "1,4"]
            argv += ["--widths", "1,2", "--new-tokens", "4", "--repeats", "1"]
        return [Step(name, argv, markdown_from_stdout=True)]

    return steps


def _bench(suite: str, compiled: bool) -> Callable[[Settings], list[Step]]:
    def steps(s: Settings) -> list[Step]:
        name = f"bench-{suite}-{'compiled' if compiled else 'eager'}"
        sizes = ["--n", "1", "--max-new-tokens", "4"] if s.quick else ["--n", "8", "--max-new-tokens", "128"]
        argv = _vlmspec("bench", "--suite", suite, "--methods", BENCH_METHODS, *sizes, "--device", s.device)
        argv += ["--compile", "on" if compiled else "off", "--out", str(s.out / name)]
        return [Step(name, argv)]

    return steps


def _batch(suite: str) -> Callable[[Settings], list[Step]]:
    def steps(s: Settings) -> list[Step]:
        name = f"batch-{suite}"
        sizes = ["--batch-size", "1,2", "--n", "2", "--max-new-tokens", "4"]
        if not s.quick:
            sizes = ["--batch-size", BATCH_SIZES, "--n", "64", "--max-new-tokens", "128"]
        argv = _vlmspec("bench", "--suite", suite, *sizes, "--device", s.device, "--out", str(s.out / name))
        return [Step(name, argv)]

    return steps


def _quantized(preset: str) -> Callable[[Settings], list[Step]]:
    def steps(s: Settings) -> list[Step]:
        sizes = ["--n", "1", "--max-new-tokens", "4"] if s.quick else ["--n", "8", "--max-new-tokens", "128"]
        out = []
        for suite in ("image", "video"):
            name = f"quant-{preset}-{suite}"
            argv = _vlmspec("bench", "--suite", suite, "--quantization", preset, "--methods", QUANT_METHODS, *sizes)
            out.append(Step(name, [*argv, "--device", s.device, "--out", str(s.out / name)]))
        return out

    return steps


def _profile(s: Settings) -> list[Step]:
    tokens = "8" if s.quick else "64"
    steps = []
    for batch_size in ("1", "16"):
        name = f"profile-b{batch_size}"
        argv = _vlmspec("profile", "--device", s.device, "--max-new-tokens", tokens, "--batch-size", batch_size)
        if s.quick:
            argv += ["--policies", "chain"]
        steps.append(Step(name, [*argv, "--out", str(s.out / name)]))
    return steps


PARTS = [
    Part("suite-eager", "the test suite on the device, eager: pass/fail counts", _suite(False)),
    Part("suite-compiled", "the test suite on the device with --compile on: pass/fail counts", _suite(True)),
    Part("bf16", "scripts/bf16_agreement.py: how often bfloat16 output equals generate, beside HF assisted", _bf16),
    *[
        Part(
            f"costs-{pair}-{mode}",
            f"scripts/step_costs.py at the released sizes of {pair}, {mode}, with its projected speedups",
            _costs(pair, mode == "compiled"),
        )
        for pair in PAIRS
        for mode in ("eager", "compiled")
    ],
    *[
        Part(
            f"bench-{suite}-{mode}",
            f"vlmspec bench --suite {suite} ({BENCH_METHODS}), {mode}",
            _bench(suite, mode == "compiled"),
        )
        for suite in BENCH_SUITES
        for mode in ("eager", "compiled")
    ],
    *[
        Part(f"batch-{suite}", f"vlmspec bench --suite {suite} --batch-size {BATCH_SIZES}", _batch(suite))
        for suite in ("image", "video")
    ],
    *[
        Part(
            f"quant-{preset}",
            f"the {preset} preset: every method's equality with the quantised target's own generate, and speed",
            _quantized(preset),
        )
        for preset in ("8bit", "4bit")
    ],
    Part("profile", "vlmspec profile at B=1 and B=16: launches and host reads per step", _profile),
]
PART_NAMES = [p.name for p in PARTS]


def suite_counts(junit: Path) -> dict:
    """Passed, failed, errors and skipped of a pytest JUnit XML report, and the failing tests' ids."""
    root = ElementTree.parse(junit).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), None)
        key = {"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[outcome]
        counts[key] += 1
        if outcome in ("failure", "error"):
            counts["failures"].append(f"{case.get('classname')}::{case.get('name')}")
    return counts


def suite_markdown(name: str, counts: dict) -> str:
    lines = [
        f"# {name}",
        "",
        "| passed | failed | errors | skipped |",
        "| --- | --- | --- | --- |",
        f"| {counts['passed']} | {counts['failed']} | {counts['errors']} | {counts['skipped']} |",
    ]
    if counts["failures"]:
        lines += ["", "Failing:", *[f"- `{test}`" for test in counts["failures"]]]
    return "\n".join(lines) + "\n"


def run_step(step: Step, settings: Settings, deadline: float) -> dict:
    """Run one step's command into its folder; returns its record (command, exit code, seconds, timed out)."""
    folder = settings.out / step.name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    timed_out = False
    with open(folder / "log.txt", "w") as log:
        process = subprocess.Popen(step.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            stdout, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, _ = process.communicate()
            timed_out = True
        log.write(stdout)
    record = {
        "step": step.name,
        "command": " ".join(step.argv),
        "exit_code": process.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "timed_out": timed_out,
    }
    if step.markdown_from_stdout and not timed_out:
        (folder / "results.md").write_text(stdout)
    if step.junit:
        junit = folder / "junit.xml"
        if junit.exists():
            counts = suite_counts(junit)
            (folder / "results.json").write_text(json.dumps(counts, indent=1))
            (folder / "results.md").write_text(suite_markdown(step.name, counts))
            record["counts"] = {k: v for k, v in counts.items() if k != "failures"}
    record["ok"] = process.returncode == 0 and not timed_out
    return record


def run_part(part: Part, settings: Settings) -> dict:
    """Every step of `part` within `PART_LIMIT` seconds together; a step that fails does not stop the next."""
    deadline = time.monotonic() + PART_LIMIT
    steps = []
    for step in part.steps(settings):
        print(f"gpu_report: {part.name}: {step.name}: {' '.join(step.argv)}", flush=True)
        steps.append(run_step(step, settings, deadline))
        status = "ok" if steps[-1]["ok"] else ("timed out" if steps[-1]["timed_out"] else "FAILED")
        print(f"gpu_report: {part.name}: {step.name}: {status} in {steps[-1]['seconds']} s", flush=True)
    return {"part": part.name, "what": part.what, "ok": all(s["ok"] for s in steps), "steps": steps}


def write_summary(out: Path, records: dict[str, dict], settings: Settings) -> None:
    """summary.json and summary.md over every part recorded in OUTDIR so far."""
    (out / "summary.json").write_text(json.dumps(records, indent=1))
    lines = [
        f"# GPU report: {device_description(settings.device)}",
        "",
        "| part | status | seconds | steps (exit codes) |",
        "| --- | --- | --- | --- |",
    ]
    for name in [n for n in PART_NAMES if n in records]:
        record = records[name]
        seconds = sum(s["seconds"] for s in record["steps"])
        codes = ", ".join(f"{s['step']} ({'timed out' if s['timed_out'] else s['exit_code']})" for s in record["steps"])
        lines.append(f"| {name} | {'ok' if record['ok'] else 'failed'} | {seconds:.0f} | {codes} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def device_description(device: str) -> str:
    """The device's name where torch can say it (the GPU's model), else the device as given."""
    try:
        import torch

        if torch.device(device).type == "cuda" and torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(torch.device(device))} ({device})"
    except (ImportError, RuntimeError):
        pass
    return device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", nargs="?", help="the folder the parts write into (made if missing)")
    parser.add_argument("parts", nargs="*", metavar="PART", help="parts to run, in the order given (default: all)")
    parser.add_argument("--device", default="cuda", help="where every part runs (default cuda)")
    parser.add_argument("--quick", action="store_true", help="smallest settings: checks that the parts run")
    parser.add_argument("--workers", type=int, default=8, help="pytest workers for the suite parts (default 8)")
    parser.add_argument("--list", action="store_true", help="name every part and what it measures, and exit")
    args = parser.parse_args(argv)
    if args.list:
        return args
    if args.out is None:
        parser.error("OUTDIR is required (the folder the parts write into)")
    unknown = [p for p in args.parts if p not in PART_NAMES]
    if unknown:
        parser.error(f"unknown parts {', '.join(unknown)}; choose from {', '.join(PART_NAMES)}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for part in PARTS:
            print(f"{part.name:<31} {part.what}")
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(out, args.device, args.quick, args.workers)
    summary = out / "summary.json"
    records = json.loads(summary.read_text()) if summary.exists() else {}
    chosen = [p for name in (args.parts or PART_NAMES) for p in PARTS if p.name == name]
    failed = []
    for part in chosen:
        records[part.name] = run_part(part, settings)
        write_summary(out, records, settings)
        if not records[part.name]["ok"]:
            failed.append(part.name)
    print(f"gpu_report: {len(chosen) - len(failed)} of {len(chosen)} parts ok; summary: {out / 'summary.md'}")
    if failed:
        print(f"gpu_report: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
