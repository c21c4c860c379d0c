"""A transformers wheel without the model code vlmspec never runs, so it travels in less room.

The full transformers 5.24 wheel is 13 MiB, 7 of it the modeling and modular files of families vlmspec never loads.
This drops every `modular_*.py` (sources for code generation, never imported) and the `modeling_*.py` files of every
model folder but the families named (default: Qwen2.5-VL, Qwen3-VL and its MoE, LLaVA-OneVision, and the Qwen2,
Qwen2-VL and SigLIP folders they reach by name) and the folders those import at run time (followed through relative
and absolute imports). Configurations, tokenizers and processors of every family stay: the auto classes import them
by scanning the families in turn. The wheel is written again with a RECORD that lists what is left. Loading another
family's model then raises `ModuleNotFoundError` naming its modeling file.

Usage: python scripts/trim_wheel.py WHEEL [--families qwen2_5_vl,qwen3_vl,llava_onevision]   (rewrites WHEEL)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

#: The families vlmspec serves, and the folders they reach through the auto classes by name (tokenizers, image
#: processors, sub-configs), not by import.
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "llava_onevision", "qwen2_vl", "qwen2", "siglip")
_MODELS = "transformers/models/"
_IMPORTED = re.compile(r"^\s*(?:from|import)\s+(?:\.\.|transformers\.models\.|\.\.\.models\.)(\w+)", re.MULTILINE)


def model_folder(name: str) -> str | None:
    """The model folder a file of the wheel sits in, or None outside `transformers/models/<folder>/`."""
    if not name.startswith(_MODELS):
        return None
    rest = name[len(_MODELS) :].split("/")
    return rest[0] if len(rest) > 1 else None


def needed_folders(wheel: zipfile.ZipFile, families: list[str]) -> set[str]:
    """`auto`, `families` and every model folder their run-time files import, transitively: the folders whose
    modeling files stay."""
    sources: dict[str, str] = {}
    for name in wheel.namelist():
        folder = model_folder(name)
        if folder is not None and name.endswith(".py") and not Path(name).name.startswith("modular_"):
            sources[folder] = sources.get(folder, "") + wheel.read(name).decode() + "\n"
    unknown = [f for f in families if f not in sources]
    if unknown:
        raise SystemExit(f"trim_wheel: no model folder {', '.join(unknown)} in the wheel")
    needed, queue = set(), ["auto", *families]
    while queue:
        folder = queue.pop()
        if folder in needed or folder not in sources:
            continue
        needed.add(folder)
        queue += _IMPORTED.findall(sources[folder])
    return needed


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(path: Path, families: list[str]) -> tuple[int, int, set[str]]:
    """Rewrite the wheel at `path` without the modeling files `families` do not need; returns its bytes before and
    after, and the folders whose modeling files were kept."""
    before = path.stat().st_size
    with zipfile.ZipFile(path) as wheel:
        keep = needed_folders(wheel, families)
        entries = []
        for info in wheel.infolist():
            folder, base = model_folder(info.filename), Path(info.filename).name
            dropped = folder is not None and (
                base.startswith("modular_") or (base.startswith("modeling_") and folder not in keep)
            )
            if not dropped and not info.filename.endswith(".dist-info/RECORD"):
                entries.append((info, wheel.read(info.filename)))
        record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    lines = [record_line(info.filename, data) for info, data in entries] + [f"{record},,"]
    trimmed = path.with_suffix(".trimmed")
    with zipfile.ZipFile(trimmed, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for info, data in entries:
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        out.writestr(record, "\n".join(lines) + "\n")
    trimmed.replace(path)
    return before, path.stat().st_size, keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a transformers wheel, rewritten in place")
    parser.add_argument("--families", default=",".join(FAMILIES), help="model folders to keep, comma-separated")
    args = parser.parse_args(argv)
    before, after, kept = trim(args.wheel, args.families.split(","))
    sizes = f"{before / 2**20:.1f} -> {after / 2**20:.1f} MiB"
    print(f"trim_wheel: {args.wheel.name}: {sizes}; modeling kept for {', '.join(sorted(kept))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
