"""The `vlmspec` command: `demo`, `generate`, `caption`, `bench`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _demo(args: argparse.Namespace) -> None:
    from .eval.demo import run_demo

    run_demo(max_new_tokens=args.max_new_tokens, policy=args.policy)


def _generate(args: argparse.Namespace) -> None:
    from .api import generate

    text = generate(
        args.prompt,
        images=args.image or None,
        videos=args.video or None,
        model=args.model,
        draft=args.draft,
        max_new_tokens=args.max_new_tokens,
        num_frames=args.num_frames,
        fps=args.fps,
        policy=args.policy,
    )
    print(text)


def _caption(args: argparse.Namespace) -> None:
    from .api import load_pair
    from .captioning import CaptionSettings, run_captioning

    def spec_factory(state):
        device_map = None if state.device.type == "cpu" else {"": str(state.device)}
        return load_pair(args.model, args.draft, device_map=device_map).with_options(args.policy)

    settings = CaptionSettings(
        prompt=args.prompt,
        num_frames=args.num_frames,
        fps=args.fps,
        max_frames=args.max_frames,
        max_new_tokens=args.max_new_tokens,
    )
    try:
        summary = run_captioning(
            spec_factory, args.inputs, Path(args.out), settings, resume=args.resume, progress=not args.no_progress
        )
    except FileExistsError as error:
        raise SystemExit(f"vlmspec caption: {error}") from None
    print(summary.line())
    if summary.interrupted:
        raise SystemExit(130)


def _bench(args: argparse.Namespace) -> None:
    import torch

    from .api import load_pair
    from .eval.bench import run_bench, write_report

    spec = load_pair(args.model, args.draft, torch_dtype=torch.float32)
    results = run_bench(spec, args.suite, args.methods.split(","), args.n, args.max_new_tokens)
    command = "vlmspec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write_report(results, Path(args.out), command)
    for name, m in results["methods"].items():
        tau = "-" if m["tau"] is None else f"{m['tau']:.2f}"
        exact = "-" if m["exact_match"] is None else f"{m['exact_match']:.2f}"
        print(f"{name:<12} tau {tau:>5}  {m['tokens_per_s']:7.1f} tok/s  speedup {m['speedup']:.2f}x  exact {exact}")
    print(f"report: {Path(args.out) / 'results.md'}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlmspec", description="Lossless speculative decoding for vision-language models."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="caption the bundled sample image and video with the demo pair")
    demo.add_argument("--max-new-tokens", type=int, default=200)
    demo.add_argument("--policy", default="sage", choices=["chain", "static-tree", "sage"])
    demo.set_defaults(run=_demo)

    gen = commands.add_parser("generate", help="answer a prompt about images and videos")
    gen.add_argument("prompt")
    gen.add_argument("--image", action="append", default=[], help="an image path or URL (repeatable)")
    gen.add_argument("--video", action="append", default=[], help="a video path (repeatable)")
    gen.add_argument("--model", help="target: hub id or directory (default: the demo pair)")
    gen.add_argument("--draft", help="draft: hub id or directory")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--num-frames", type=int)
    gen.add_argument("--fps", type=float)
    gen.add_argument("--policy", default="sage", choices=["chain", "static-tree", "sage"])
    gen.set_defaults(run=_generate)

    cap = commands.add_parser("caption", help="caption images and videos into a JSON-lines file")
    cap.add_argument("inputs", nargs="+", help="files, folders (searched recursively) or .txt lists of paths")
    cap.add_argument("--out", required=True, help="the JSON-lines file to write")
    cap.add_argument("--prompt", help="default: 'Describe the image/video in detail.'")
    cap.add_argument("--model", help="target: hub id or directory (default: the demo pair)")
    cap.add_argument("--draft", help="draft: hub id or directory")
    frames = cap.add_mutually_exclusive_group()
    frames.add_argument("--num-frames", type=int, help="frames per video, evenly spread")
    frames.add_argument("--fps", type=float, help="frames per second to sample (default 2)")
    cap.add_argument("--max-frames", type=int, help="cap on frames sampled by --fps (default 64)")
    cap.add_argument("--max-new-tokens", type=int, default=256)
    cap.add_argument("--policy", default="sage", choices=["chain", "static-tree", "sage"])
    cap.add_argument("--resume", action="store_true", help="skip inputs already recorded in --out")
    cap.add_argument("--no-progress", action="store_true", help="no progress bar")
    cap.set_defaults(run=_caption)

    bench = commands.add_parser("bench", help="tau and speedup of every method against plain generate")
    bench.add_argument("--suite", choices=["image", "video"], default="video")
    bench.add_argument("--methods", default="ar,hf-assisted,chain,static-tree,specvlm,sage")
    bench.add_argument("--n", type=int, default=8)
    bench.add_argument("--max-new-tokens", type=int, default=200)
    bench.add_argument("--model", help="target (default: the demo pair)")
    bench.add_argument("--draft", help="draft (default: the demo pair)")
    bench.add_argument("--out", default="bench-out")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
