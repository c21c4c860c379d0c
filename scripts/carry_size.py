"""What travels to a lent GPU machine, and whether it fits: the working tree plus the carried paths, against 64 MiB.

What travels is what git would hand over (tracked files and untracked files git does not ignore) plus every path
named to carry (ignored folders such as the wheels in `.whl/`). Outside a git checkout (on the GPU machine, which gets
a copy of the tree) every file under the root counts but for `.git`, virtual environments and caches.

Usage: python scripts/carry_size.py [--carry PATH ...] [--limit-mib 64]
Prints the sizes and exits 1, naming the largest contributors, when the total is over the limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The most a lent machine takes: the working tree and the carried paths together.
LIMIT_MIB = 64.0
_NOT_TRAVELLING = {".git", ".venv", ".venv-torchvision", "__pycache__", ".pytest_cache", ".ruff_cache"}


def tree_files(root: Path) -> list[Path]:
    """The files of `root`'s working tree that travel: git's tracked and not-ignored files, or every file outside
    `.git`, virtual environments and caches where `root` is no git checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in root.rglob("*") if p.is_file() and not _NOT_TRAVELLING & set(p.relative_to(root).parts)]
    return [root / name for name in sorted(set(listed.decode().split("\0"))) if name and (root / name).is_file()]


def carried_files(root: Path, carry: list[str]) -> list[Path]:
    """Every file under the carried paths (a file, or a folder walked whole)."""
    files = []
    for name in carry:
        path = root / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return files


def sizes(root: Path, carry: list[str]) -> dict:
    """Bytes of the tree and of the carried paths, their total, and the ten largest files of both."""
    tree, carried = tree_files(root), carried_files(root, carry)
    everything = {p: p.stat().st_size for p in [*tree, *carried]}
    largest = sorted(everything.items(), key=lambda item: -item[1])[:10]
    return {
        "tree_bytes": sum(p.stat().st_size for p in tree),
        "carried_bytes": sum(p.stat().st_size for p in carried),
        "total_bytes": sum(everything.values()),
        "carried": {str(p.relative_to(root)): p.stat().st_size for p in carried},
        "largest": {str(p.relative_to(root)): size for p, size in largest},
    }


def mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--carry", nargs="*", default=[], help="ignored paths that travel too (e.g. .whl)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="the most that may travel (default 64)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    missing = [name for name in args.carry if not (args.root / name).exists()]
    if missing:
        print(f"carry_size: nothing at {', '.join(missing)} to carry (run scripts/carry.sh first)", file=sys.stderr)
        return 1
    measured = sizes(args.root, args.carry)
    print(
        f"tree {mib(measured['tree_bytes'])} + carried {mib(measured['carried_bytes'])} = "
        f"{mib(measured['total_bytes'])} of {args.limit_mib:.0f} MiB"
    )
    if measured["total_bytes"] <= args.limit_mib * 2**20:
        return 0
    over = measured["total_bytes"] - args.limit_mib * 2**20
    largest = ", ".join(f"{name} {mib(size)}" for name, size in list(measured["largest"].items())[:5])
    print(
        f"carry_size: {mib(measured['total_bytes'])} would travel, {mib(over)} over the {args.limit_mib:.0f} MiB a "
        f"lent machine takes; the largest files: {largest}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
