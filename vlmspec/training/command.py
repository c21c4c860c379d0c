"""The `vlmspec train-draft` command line."""

from __future__ import annotations

import argparse
import sys

from ..errors import VLMSpecError

#: Exit codes, as the other commands use them.
EXIT_CONFIGURATION = 2


def add_train_draft_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec train-draft`: fit a draft to its target."""
    parser = commands.add_parser(
        "train-draft", help="train a draft or a draft head to agree with its target (distillation or VSD)"
    )
    parser.add_argument("--target", required=True, help="the target (hub id or folder)")
    parser.add_argument(
        "--draft", help="the draft or head to start from (hub id or folder; none: a new head for the target)"
    )
    parser.add_argument(
        "--kind", choices=["model", "head"], help="what to train (default: the kind of --draft; a head without one)"
    )
    parser.add_argument(
        "--data", required=True, help="a folder of media or a JSONL file of {media, prompt[, response]}"
    )
    parser.add_argument("--out", required=True, help="the run's folder: responses, logs, checkpoints, the draft")
    parser.add_argument("--objective", choices=["kd", "vsd"], default="kd")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default 200 without --time-budget)")
    parser.add_argument("--time-budget", type=float, default=None, help="minutes of training at most")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--accumulation", type=int, default=1, help="items per optimiser step")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=None, help="held-out tau every N steps (and at the end)")
    parser.add_argument("--eval-items", type=int, default=4, help="the data's last N items, held out")
    parser.add_argument(
        "--pruning",
        choices=["auto", "verifier", "off"],
        default="auto",
        help="the visual tokens the draft sees, as at decoding (auto: verifier-guided pruning for a VLM draft, every "
        "token for a head)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the length of responses the target writes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vsd-samples", type=int, default=8, help="VSD: draft paths per anchor (S)")
    parser.add_argument("--vsd-length", type=int, default=4, help="VSD: tokens per path (L)")
    parser.add_argument("--vsd-anchors", type=int, default=2, help="VSD: anchors per response")
    parser.add_argument("--vsd-weight", type=float, default=1.0, help="VSD: its term's weight beside distillation")
    parser.add_argument(
        "--draft-vocab", type=int, help="a new head's draft vocabulary: the N most frequent response tokens"
    )
    parser.add_argument("--ttt-steps", type=int, default=7, help="a head's unrolled training-time test steps")
    parser.add_argument("--intermediate-size", type=int, help="a new head's MLP width (default: the target's)")
    parser.add_argument("--resume", action="store_true", help="go on from the run in --out")
    parser.set_defaults(run=_train_draft)


def _train_draft(args: argparse.Namespace) -> None:
    from .trainer import settings_from, train_draft

    if args.steps is None and args.time_budget is None:
        args.steps = 200
    try:
        folder = train_draft(settings_from(args), resume=args.resume)
    except (VLMSpecError, OSError) as error:
        print(f"vlmspec train-draft: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIGURATION) from None
    print(f"vlmspec train-draft: the draft is in {folder}")
