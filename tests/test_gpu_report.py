"""`scripts/gpu_report.py`: its arguments, its list of parts, and the commands of the GPU parts at their full settings
(the parts that run on the CPU are tests/test_gpu_report_cpu.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_report.py"
sys.path.insert(0, str(SCRIPT.parent))

import gpu_report  # noqa: E402


def report(*args: str) -> subprocess.CompletedProcess:
    """`scripts/gpu_report.py ARGS` run to its end, its output captured."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)


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
