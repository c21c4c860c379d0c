"""Share of wall time spent outside model forwards (tree building, acceptance, cache bookkeeping).

Runs the tiny fixture pair with the target as its own draft and times every top-level model forward with hooks.
Usage: .venv/bin/python scripts/overhead.py [--max-new-tokens N] [--repeats R] [--hidden-size H --layers L]
"""

from __future__ import annotations

import argparse
import time

import torch

from vlmspec import SpeculativeVLM
from vlmspec.testing import chat_inputs, sample_image, tiny_processor, tiny_qwen2_5_vl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden-size", type=int, default=64, help="fixture default: 64")
    parser.add_argument("--layers", type=int, default=2, help="fixture default: 2")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = tiny_qwen2_5_vl(seed=0, hidden_size=args.hidden_size, num_layers=args.layers)
    inputs = chat_inputs(tiny_processor(), "Describe the image in detail.", images=[sample_image(0)])
    in_forward = [0.0]
    started: list[float] = []
    target.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
    target.register_forward_hook(
        lambda *_: in_forward.__setitem__(0, in_forward[0] + time.perf_counter() - started.pop())
    )
    print(f"{'policy':<12} {'tokens':>6} {'steps':>5} {'tau':>5} {'wall s':>7} {'outside forwards':>17}")
    for policy in ("chain", "static-tree", "sage"):
        spec = SpeculativeVLM(target, target, policy=policy)
        spec.generate(**inputs, max_new_tokens=8)
        in_forward[0], wall = 0.0, 0.0
        for _ in range(args.repeats):
            start = time.perf_counter()
            spec.generate(**inputs, max_new_tokens=args.max_new_tokens)
            wall += time.perf_counter() - start
        stats = spec.last_stats
        share = 1.0 - in_forward[0] / wall
        print(
            f"{policy:<12} {stats.new_tokens:>6} {stats.iterations:>5} {stats.mean_accept_length:>5.2f} "
            f"{wall / args.repeats:>7.3f} {share:>16.1%}"
        )


if __name__ == "__main__":
    main()
