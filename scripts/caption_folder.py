"""Write a folder of mixed media for captioning benchmarks: the demo pair's held-out scenes as PNG images and as MP4
clips of different lengths.

Items alternate between images and videos; clip i has 4 to 16 seconds at 2 fps (8 to 32 frames), so a batch holds
prompts of different lengths and captions that end at different points. `vlmspec caption` and
`scripts/caption_plain.py` then run over the same files.

Usage: .venv/bin/python scripts/caption_folder.py OUT_DIR [--n 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from vlmspec.eval.synthetic import VIDEO_FPS, items, make_item, write_clip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=64)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for index, item in enumerate(items("held-out", args.n)):
        if index % 2 == 0:
            make_item(item.seed, "image").image.save(args.out / f"{index:03d}-image.png")
            continue
        frames = 8 + 8 * ((index // 2) % 4)
        clip = make_item(item.seed, "video", num_frames=frames)
        write_clip(args.out / f"{index:03d}-video.mp4", [np.asarray(f) for f in clip.frames], VIDEO_FPS)
    print(f"wrote {args.n} inputs to {args.out}")


if __name__ == "__main__":
    main()
