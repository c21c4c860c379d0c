"""`scripts/gpu_report.py` on the CPU (`--quick`, `--device cpu`): the parts that run there write their tables as
markdown and JSON and a summary of every part; a failed part is recorded with a non-zero exit and the next goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_report.py"

#: The parts run on the CPU here (the step costs' quick run is the first look's, tests/test_first_look.py).
CPU_PARTS = ["suite-eager", "batch-image", "profile"]


def report(*args: str) -> subprocess.CompletedProcess:
    """`scripts/gpu_report.py ARGS` run to its end, its output captured."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """The one OUTDIR every run in this file writes into, so a later run merges into its summary."""
    return tmp_path_factory.mktemp("gpu-report")


@pytest.fixture(scope="module")
def cpu_run(out) -> subprocess.CompletedProcess:
    """The parts that run on the CPU, run once at their quick settings for every test here."""
    return report(str(out), *CPU_PARTS, "--device", "cpu", "--quick")


def test_the_cpu_parts_run_and_write_markdown_and_json_for_every_step(cpu_run, out):
    assert cpu_run.returncode == 0, cpu_run.stderr
    for step in ("suite-eager", "batch-image", "profile-b1", "profile-b16"):
        assert (out / step / "results.md").read_text().strip(), step
        json.loads((out / step / "results.json").read_text())
        assert (out / step / "log.txt").exists()
    profiled = json.loads((out / "profile-b16" / "results.json").read_text())
    assert profiled["device"] == "cpu"
    assert {p["method"] for p in profiled["profiles"]} == {"generate, B=16", "chain, B=16"}
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == CPU_PARTS and all(summary[p]["ok"] for p in CPU_PARTS)


def test_the_suite_part_counts_passes_and_failures(cpu_run, out):
    counts = json.loads((out / "suite-eager" / "results.json").read_text())
    assert counts["passed"] > 0 and counts["failed"] == counts["errors"] == 0 and counts["failures"] == []
    assert f"| {counts['passed']} | 0 | 0 |" in (out / "suite-eager" / "results.md").read_text()


def test_a_failing_part_is_recorded_the_next_goes_on_and_the_run_exits_1(cpu_run, out):
    failed = report(str(out), "profile", "batch-image", "--device", "no-such-device", "--quick")
    assert failed.returncode == 1
    assert "failed: profile, batch-image" in failed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["profile"]["ok"] and not summary["batch-image"]["ok"]
    assert summary["suite-eager"]["ok"], "a later run merges into the summary"
    assert "no-such-device" in (out / "profile-b1" / "log.txt").read_text()
    table = (out / "summary.md").read_text()
    assert "| profile | failed |" in table and "| suite-eager | ok |" in table
