"""The GPU first look's time boxes (`scripts/first_look.py`): a failed or overlong sub-step is recorded and the next
goes on, unused seconds pass on, none starts past the budget; through `scripts/gpu_report.sh OUTDIR first-look`,
sub-steps on a missing device fail and are recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import first_look  # noqa: E402
from first_look_steps import STEPS, Settings, SubStep, read_results  # noqa: E402

NAMES = [step.name for step in STEPS]


def sleeper(name: str, seconds: float | None, sleep: float, code: int = 0) -> SubStep:
    """A sub-step that sleeps `sleep` seconds, then exits `code`, writing a one-line result."""
    script = f"import json,sys,time; time.sleep({sleep}); d=sys.argv[1]; "
    script += (
        f"open(d+'/results.md','w').write('{name} done'); open(d+'/results.json','w').write('{{}}'); sys.exit({code})"
    )
    return SubStep(
        name, f"sleeps {sleep} s", seconds, lambda s, folder: [sys.executable, "-c", script, str(folder)], read_results
    )


def test_a_sub_step_past_its_limit_is_stopped_and_recorded_and_the_next_goes_on(tmp_path):
    steps = [sleeper("slow", 6, 60), sleeper("fails", 10, 0, code=3), sleeper("last", None, 0)]
    records = first_look.run(Settings(tmp_path / "work", "cpu", True, 60), tmp_path, steps)
    assert [r["status"] for r in records] == ["timed out", "failed (exit 3)", "ok"]
    assert records[0]["seconds"] < 30
    assert "## slow: timed out" in (tmp_path / "first-look.md").read_text()


def test_unused_seconds_pass_to_the_next_sub_step_and_none_starts_past_the_budget(tmp_path):
    steps = [sleeper("quick", 6, 0, code=3), sleeper("next", 6, 0), sleeper("long", None, 60)]
    records = first_look.run(Settings(tmp_path / "work", "cpu", True, 15), tmp_path, steps)
    assert records[1]["limit"] > 9, "the first sub-step's unused seconds (it failed fast) were added to the second's 6"
    assert records[2]["status"] == "timed out" and records[2]["limit"] <= 15
    late = first_look.run(Settings(tmp_path / "late", "cpu", True, 3), tmp_path, [sleeper("late", 20, 0)])
    assert late[0]["status"] == "skipped: no time left"


def test_through_gpu_report_sh_sub_steps_on_a_missing_device_fail_and_are_recorded_and_the_run_exits_1(tmp_path):
    argv = ["bash", "scripts/gpu_report.sh", str(tmp_path), "first-look", "--device", "no-such-device", "--quick"]
    finished = subprocess.run(
        [*argv, "--budget", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert finished.returncode == 1
    records = json.loads((tmp_path / "first-look.json").read_text())["sub_steps"]
    assert [r["name"] for r in records] == NAMES
    assert records[0]["status"] == "ok" and records[1]["status"].startswith("failed (exit ")
    assert all(r["status"] != "ok" for r in records[2:]), "failed, timed out or skipped: none can pass"
    assert "no-such-device" in (tmp_path / "first-look.log").read_text()
