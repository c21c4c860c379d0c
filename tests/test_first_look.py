"""The GPU first look's quick run (`scripts/first_look.py OUTDIR --device cpu --quick`): every sub-step runs on the
CPU at its quick settings and is gathered into three files: the status table, each sub-step's tables, its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from first_look_steps import STEPS  # noqa: E402

NAMES = [step.name for step in STEPS]


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The quick CPU run, once for every test here: its finished process and its OUTDIR."""
    out = tmp_path_factory.mktemp("first-look")
    argv = [sys.executable, "scripts/first_look.py", str(out), "--device", "cpu", "--quick", "--budget", "900"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True), out


def test_the_quick_cpu_run_passes_every_sub_step_in_order(quick):
    finished, out = quick
    assert finished.returncode == 0, finished.stderr + (out / "first-look.md").read_text()
    document = json.loads((out / "first-look.json").read_text())
    assert [r["name"] for r in document["sub_steps"]] == NAMES
    assert all(r["status"] == "ok" for r in document["sub_steps"])
    assert sorted(p.name for p in out.iterdir()) == ["first-look.json", "first-look.log", "first-look.md"]


def test_the_tables_of_every_sub_step_are_in_the_markdown(quick):
    _, out = quick
    markdown = (out / "first-look.md").read_text()
    for name in NAMES:
        assert f"## {name}: ok" in markdown
    assert "travelled in all:" in markdown
    assert "Compiled path: eager: compile='auto' compiles on CUDA only" in markdown
    assert "| ar-compiled |" in markdown and "| auto |" in markdown
    assert "break-even" in markdown and "| chain, B=16 | greedy |" in markdown
    log = (out / "first-look.log").read_text()
    assert all(f"===== {name}: ok" in log for name in NAMES)


def test_the_numbers_are_kept_as_json(quick):
    _, out = quick
    records = {r["name"]: r for r in json.loads((out / "first-look.json").read_text())["sub_steps"]}
    assert records["environment"]["results"]["torch"]
    demo = records["demo-eager"]["results"]
    assert set(demo["methods"]) == {"ar", "ar-compiled", "auto"} and demo["methods"]["auto"]["exact_match"] == 1.0
    assert records["demo-compiled"]["results"]["fallbacks"] == []
    costs = records["costs-llava_onevision"]["results"]["pairs"]["llava_onevision"]
    assert set(costs["contexts"]["32"]["projection"]["sage"]) == {"ms_per_step", "speedup", "own_break_even_ms"}
    assert records["exactness"]["results"]["passed"] > 0 and records["exactness"]["results"]["failed"] == 0
