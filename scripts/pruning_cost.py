"""What verifier-guided pruning costs and saves, on the tiny fixtures of every family.

Prints, per family, for a video of --frames frames: scoring + selection time as a share of target prefill time,
and the draft's prefill time and token count with and without pruning (medians over --repeats calls).
Usage: .venv/bin/python scripts/pruning_cost.py [--frames 16] [--repeats 5] [--size 224] [--hidden-size 64 --layers 2]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from vlmspec import SpeculativeVLM
from vlmspec.testing import TINY_FAMILIES, chat_inputs, noisy_copy, sample_frames


def median_stats(spec: SpeculativeVLM, inputs: dict, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats + 1):
        spec.generate(**inputs, max_new_tokens=2)
        runs.append(spec.last_stats)
    runs = runs[1:]
    return {
        "target_prefill": statistics.median(r.phase_seconds["target_prefill"] for r in runs),
        "pruning": statistics.median(r.phase_seconds["pruning"] for r in runs),
        "draft_prefill": statistics.median(r.phase_seconds["draft_prefill"] for r in runs),
        "draft_tokens": runs[-1].draft_prefill_tokens,
        "target_tokens": runs[-1].target_prefill_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=224, help="frame height and width in pixels")
    parser.add_argument("--hidden-size", type=int, default=64, help="language model width (fixture default: 64)")
    parser.add_argument("--layers", type=int, default=2, help="language model depth (fixture default: 2)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(
        f"{'family':<16} {'prompt':>6} {'pruning/prefill':>15} {'draft tokens':>13} "
        f"{'draft prefill ms (none -> 90%)':>31} {'ratio':>6}"
    )
    for name, (make_processor, make_target) in TINY_FAMILIES.items():
        target = make_target(0, hidden_size=args.hidden_size, num_layers=args.layers)
        draft = noisy_copy(target, 0.05)
        frames = sample_frames(0, num_frames=args.frames, size=(args.size, args.size))
        inputs = chat_inputs(make_processor(), "Describe the video in detail.", video=frames)
        pruned = median_stats(SpeculativeVLM(target, draft, pruning="verifier"), inputs, args.repeats)
        full = median_stats(SpeculativeVLM(target, draft, pruning=None), inputs, args.repeats)
        share = pruned["pruning"] / pruned["target_prefill"]
        print(
            f"{name:<16} {pruned['target_tokens']:>6} {share:>15.2%} "
            f"{full['draft_tokens']:>5} -> {pruned['draft_tokens']:<5} "
            f"{full['draft_prefill'] * 1e3:>14.1f} -> {pruned['draft_prefill'] * 1e3:<14.1f} "
            f"{pruned['draft_prefill'] / full['draft_prefill']:>6.2f}"
        )


if __name__ == "__main__":
    main()
