"""What verifying a tree costs as the cache grows: the demo target at the video suite's context and the long-video
suite's, per attention implementation the engine can run trees through.

Prints the median ms of one verification forward (and the cache's rewind after it) for trees of --nodes
nodes over caches of --contexts tokens (defaults: 89 and 2,329, the two suites' prompt lengths).
Usage: .venv/bin/python scripts/verify_context.py [--contexts 89,2329] [--nodes 1,6,26,64] [--repeats 20]
"""

from __future__ import annotations

import argparse

import torch
from step_costs import verification_ms

from vlmspec.api import load_pair
from vlmspec.loading import TREE_ATTENTION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=lambda t: [int(v) for v in t.split(",")], default=[89, 2329])
    parser.add_argument("--nodes", type=lambda t: [int(v) for v in t.split(",")], default=[1, 6, 26, 64])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_pair(torch_dtype=torch.float32).target
    print("| attention | context | " + " | ".join(f"{n} nodes ms" for n in args.nodes) + " |")
    print("| --- " * (2 + len(args.nodes)) + "|")
    with torch.inference_mode():
        for implementation in TREE_ATTENTION:
            target.set_attn_implementation(implementation)
            for context in args.contexts:
                cells = verification_ms(target, context, args.nodes, args.repeats)
                print(f"| {implementation} | {context} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    target.set_attn_implementation("sdpa")


if __name__ == "__main__":
    main()
