"""The `vlmspec calibrate` command line (torch is imported only when it runs)."""

from __future__ import annotations

import argparse
import sys

#: Exit code of a configuration the command refuses, as the other commands use it.
EXIT_CONFIGURATION = 2


def add_calibrate_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec calibrate`: fit HeteroSpec's path-entropy bins to a pair."""
    parser = commands.add_parser(
        "calibrate", help="fit the heterospec policy's path-entropy bins to a target and draft"
    )
    parser.add_argument("--target", help="the target, hub id or folder (default: the demo pair's)")
    parser.add_argument("--draft", help="the draft, hub id or folder (default: the demo pair's)")
    parser.add_argument(
        "--data",
        help="a folder of media or a JSONL file of {media, prompt} to decode (default: synthetic held-out items)",
    )
    parser.add_argument("--out", help="the bins' file (default: heterospec_bins.json in the draft's folder)")
    parser.add_argument("--n", type=int, default=24, help="prompts to decode (default 24)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", help="where the pair runs, e.g. cuda (default: the first GPU, else the CPU)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    parser.set_defaults(run=_calibrate)


def _calibrate(args: argparse.Namespace) -> None:
    from ..api import default_device_map, load_pair
    from ..errors import VLMSpecError
    from .calibrate import bins_table, calibrate

    if args.n < 1 or args.max_new_tokens < 1:
        print("vlmspec calibrate: --n and --max-new-tokens must be at least 1", file=sys.stderr)
        raise SystemExit(EXIT_CONFIGURATION)
    device_map = {"": args.device} if args.device else default_device_map()
    try:
        spec = load_pair(args.target, args.draft, torch_dtype=args.dtype, device_map=device_map)
        run = calibrate(spec, args.data, args.out, args.n, args.max_new_tokens)
    except (VLMSpecError, OSError) as error:
        print(f"vlmspec calibrate: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIGURATION) from None
    fitted = run.bins.fitted
    print(
        f"vlmspec calibrate: {fitted['paths']} fully accepted paths of {fitted['steps']} drafted steps over "
        f"{fitted['items']} prompts, {fitted['seconds']} s"
    )
    print(bins_table(run.bins))
    print(f"bins written to {run.path}")
