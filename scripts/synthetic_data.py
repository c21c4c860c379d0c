"""Write items of the synthetic captioning suite's training split as a folder of media `vlmspec train-draft --data`
reads (PNG images and MP4 videos, alternating; the folder's prompts are the suite's), none of them a bench item.

    python scripts/synthetic_data.py --out data/synthetic --count 200 --start 40000
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlmspec.eval.synthetic import VIDEO_FPS, items, write_clip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--start", type=int, default=40_000, help="the first training item (the demo saw fewer)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for item in items("train", args.count, args.start):
        name = out / f"{item.seed:07d}"
        if item.kind == "image":
            item.image.save(name.with_suffix(".png"))
        else:
            write_clip(name.with_suffix(".mp4"), item.video, VIDEO_FPS, bit_rate=4_000_000)
    print(f"{args.count} items in {out}")


if __name__ == "__main__":
    main()
