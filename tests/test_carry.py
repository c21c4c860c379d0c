"""The carry recipe of the GPU first look: the size check of what travels (`scripts/carry_size.py`) and its trimmed
transformers wheel (`scripts/trim_wheel.py`)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import carry_size  # noqa: E402
import trim_wheel  # noqa: E402


def git_tree(root: Path, files: dict[str, int], ignored: str = "") -> None:
    """A git repository at `root` holding `files` (name: size in bytes) and a .gitignore of `ignored`."""
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
    """A transformers wheel at `path` with one family, one it imports, one unused, and a stale RECORD."""
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
