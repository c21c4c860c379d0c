"""The GPU first look (`scripts/gpu_report.sh OUTDIR first-look`): every sub-step runs on the CPU at its quick settings
and is gathered into three files; sub-steps are time-boxed, a failed or overlong one is recorded and the next goes
on; the carry recipe's size check and its trimmed transformers wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import carry_size  # noqa: E402
import first_look  # noqa: E402
import trim_wheel  # noqa: E402
from first_look_steps import STEPS, Settings, SubStep, read_results  # noqa: E402

NAMES = [step.name for step in STEPS]


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
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
        [*argv, "--budget", "20"],
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


def git_tree(root: Path, files: dict[str, int], ignored: str = "") -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text(ignored)
    for name, size in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * size)


def test_what_travels_is_the_tree_git_would_hand_over_and_the_carried_paths(tmp_path):
    git_tree(tmp_path, {"a.py": 1000, "big.bin": 5000, "wheels/w.whl": 3000, "skip/x": 7000}, "wheels/\nskip/\n")
    measured = carry_size.sizes(tmp_path, ["wheels"])
    assert measured["carried_bytes"] == 3000
    assert measured["total_bytes"] == measured["tree_bytes"] + 3000 == 1000 + 5000 + len("wheels/\nskip/\n") + 3000
    assert list(measured["largest"])[0] == "big.bin"


def test_over_the_limit_the_size_check_fails_naming_the_largest_files(tmp_path, capsys):
    git_tree(tmp_path, {"big.bin": 2 * 2**20, "wheels/w.whl": 2**20}, "wheels/\n")
    assert carry_size.main(["--root", str(tmp_path), "--carry", "wheels", "--limit-mib", "4"]) == 0
    assert carry_size.main(["--root", str(tmp_path), "--carry", "wheels", "--limit-mib", "2.5"]) == 1
    assert "over the 2 MiB a lent machine takes; the largest files: big.bin 2.0 MiB" in capsys.readouterr().err
    assert carry_size.main(["--root", str(tmp_path), "--carry", "missing"]) == 1


def fake_wheel(path: Path) -> None:
    files = {
        "transformers/__init__.py": "",
        "transformers/models/auto/configuration_auto.py": "NAMES = {}",
        "transformers/models/fam/modeling_fam.py": "from ..helper.modeling_helper import X\n",
        "transformers/models/fam/modular_fam.py": "from ..unused.modeling_unused import Y\n",
        "transformers/models/helper/modeling_helper.py": "X = 1\n",
        "transformers/models/unused/modeling_unused.py": "Y = 1\n",
        "transformers/models/unused/tokenization_unused.py": "Z = 1\n",
        "transformers-0.0.dist-info/RECORD": "stale\n",
    }
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


def test_the_trimmed_wheel_keeps_the_families_modeling_what_they_import_every_tokenizer_and_a_true_record(tmp_path):
    path = tmp_path / "transformers-0.0-py3-none-any.whl"
    fake_wheel(path)
    _, _, kept = trim_wheel.trim(path, ["fam"])
    assert kept == {"auto", "fam", "helper"}
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        record = wheel.read("transformers-0.0.dist-info/RECORD").decode().splitlines()
        data = wheel.read("transformers/models/helper/modeling_helper.py")
    assert "transformers/models/unused/modeling_unused.py" not in names
    assert "transformers/models/unused/tokenization_unused.py" in names
    assert "transformers/models/fam/modular_fam.py" not in names
    assert trim_wheel.record_line("transformers/models/helper/modeling_helper.py", data) in record
    assert len(record) == len(names)


def test_trimming_for_a_family_the_wheel_lacks_is_refused(tmp_path):
    path = tmp_path / "transformers-0.0-py3-none-any.whl"
    fake_wheel(path)
    with pytest.raises(SystemExit, match="no model folder nope"):
        trim_wheel.trim(path, ["nope"])
