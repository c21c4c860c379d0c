"""`scripts/gpu_report.py`: its arguments, and the parts that run on the CPU (`--quick`, `--device cpu`) writing their
tables as markdown and JSON, a summary of every part, and a failed part recorded with a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_report.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_report  # noqa: E402

#: The parts run on the CPU here (the step costs' quick run is the first look's, tests/test_first_look.py).
CPU_PARTS = ["suite-eager", "batch-image", "profile"]


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu-report")


@pytest.fixture(scope="module")
def cpu_run(out) -> subprocess.CompletedProcess:
    return report(str(out), *CPU_PARTS, "--device", "cpu", "--quick")


def test_list_names_every_part_with_what_it_measures():
    listed = report("--list")
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == gpu_report.PART_NAMES
    for pair in gpu_report.PAIRS:
        assert {f"costs-{pair}-eager", f"costs-{pair}-compiled"} <= set(names)
    for suite in gpu_report.BENCH_SUITES:
        assert {f"bench-{suite}-eager", f"bench-{suite}-compiled"} <= set(names)
    assert {"suite-eager", "suite-compiled", "bf16", "batch-image", "quant-8bit", "quant-4bit", "profile"} <= set(names)


@pytest.mark.parametrize(
    ("args", "message"),
    [((), "OUTDIR is required"), (("out", "no-such-part"), "unknown parts no-such-part; choose from suite-eager")],
)
def test_bad_arguments_exit_2_naming_the_problem(args, message):
    refused = report(*args)
    assert refused.returncode == 2
    assert message in refused.stderr


def test_the_gpu_parts_default_to_cuda_at_their_full_settings(tmp_path):
    settings = gpu_report.Settings(tmp_path, "cuda", quick=False, workers=8)
    parts = {p.name: p for p in gpu_report.PARTS}
    (suite,) = parts["suite-compiled"].steps(settings)
    assert suite.argv[suite.argv.index("--device") + 1] == "cuda" and "on" in suite.argv and "-n" in suite.argv
    (batch,) = parts["batch-video"].steps(settings)
    assert batch.argv[batch.argv.index("--batch-size") + 1] == "1,4,8,16,32,64"
    (bench,) = parts["bench-long-video-compiled"].steps(settings)
    assert bench.argv[bench.argv.index("--methods") + 1] == "ar,ar-compiled,hf-assisted,chain,sage,sage-gt"
    assert [s.name for s in parts["quant-4bit"].steps(settings)] == ["quant-4bit-image", "quant-4bit-video"]


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
