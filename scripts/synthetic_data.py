"""Write items of the synthetic captioning suite's training split as a folder of media `vlmspec train-draft --data`
reads (PNG images and MP4 videos, alternating; the folder's prompts are the suite's), none of them a bench item.

    python scripts/synthetic_data.py --out data/synthetic --count 200 --start 40000
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlmspec.eval.synthetic import VIDEO_FPS, items


def write_video(frames, path: Path) -> None:
    """Frames `(T, H, W, 3)` as an MP4 at the suite's frame rate."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=int(VIDEO_FPS))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


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
            write_video(item.video, name.with_suffix(".mp4"))
    print(f"{args.count} items in {out}")


if __name__ == "__main__":
    main()
