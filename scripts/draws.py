"""Several sampled draws of one prompt (`num_return_sequences`): plain `generate` against vlmspec's default, timed.

Both draw n continuations of each item of a suite from one call; vlmspec decodes them together as a batch's rows.
Runs on the demo pair. Prints a markdown table of the best of `--repeats` timed calls per item.
Usage: .venv/bin/python scripts/draws.py [--suite image|video] [--items N] [--draws N] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from vlmspec.api import load_pair
from vlmspec.eval.bench import suite_inputs


def best_seconds(generate: Callable[..., object], inputs: dict, settings: dict, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `generate(**inputs, **settings)`, after one untimed call."""
    generate(**inputs, **settings)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        generate(**inputs, **settings)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="image", choices=["image", "video"])
    parser.add_argument("--items", type=int, default=1)
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = load_pair(torch_dtype=torch.float32)
    settings = dict(
        do_sample=True,
        temperature=args.temperature,
        num_return_sequences=args.draws,
        max_new_tokens=args.max_new_tokens,
    )
    print(f"{args.draws} draws of {args.max_new_tokens} tokens, {args.suite} suite, best of {args.repeats}\n")
    print("| item | `target.generate` | vlmspec, default | ratio |\n| --- | --- | --- | --- |")
    for index, inputs in enumerate(suite_inputs(spec.processor, args.suite, args.items)):
        plain = best_seconds(spec.target.generate, inputs, settings, args.repeats)
        ours = best_seconds(spec.generate, inputs, settings, args.repeats)
        print(f"| {index} | {plain:.2f} s | {ours:.2f} s | {plain / ours:.2f}x |")


if __name__ == "__main__":
    main()
