"""What verifying a tree costs as the cache grows: the demo target at the video suite's context and the long-video
suite's, through the tree attention and through the model's own attention with a full-width mask.

Prints the median ms of one verification forward (and the cache's rewind after it) for trees of --nodes
nodes over caches of --contexts tokens (defaults: 89 and 2,329, the two suites' prompt lengths), for each
implementation the engine runs trees on (sdpa, eager): "tree" is the engine's path (the prefix unmasked on the
fused kernel, the tree block masked, merged by log-sum-exp, no key copied per query head), "full mask" the
model's own attention given a dense `(1, 1, n, context + n)` mask.
Usage: .venv/bin/python scripts/verify_context.py [--contexts 89,2329] [--nodes 1,6,26,64] [--repeats 20]
"""

from __future__ import annotations

import argparse

import torch
from step_costs import k_ary_tree, prefilled, regular_ids, rewound_ms, verification_ms
from transformers import PreTrainedModel

from vlmspec.api import load_pair
from vlmspec.loading import TREE_ATTENTION


def full_mask_ms(model: PreTrainedModel, context: int, nodes: list[int], repeats: int) -> list[float]:
    """The target's forward over a tree of each size in `nodes` through its own attention and a full-width mask."""
    runner = prefilled(model, context)
    start = runner.lengths[0]

    def verify(tree, position: torch.Tensor) -> None:
        runner.cache.prepare(tree.size)
        bias = tree.attention_bias(runner.dtype, prefix_len=start)
        runner.adapter.decode(tree.tokens, tree.depths + position, bias, runner.cache)
        runner.cache.commit([tree.size])

    trees = [k_ary_tree(n, runner.device, high=regular_ids(model)) for n in nodes]
    return [rewound_ms(runner, lambda position, tree=tree: verify(tree, position), repeats) for tree in trees]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=lambda t: [int(v) for v in t.split(",")], default=[89, 2329])
    parser.add_argument("--nodes", type=lambda t: [int(v) for v in t.split(",")], default=[1, 6, 26, 64])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_pair(torch_dtype=torch.float32).target
    print("| attention | path | context | " + " | ".join(f"{n} nodes ms" for n in args.nodes) + " |")
    print("| --- " * (3 + len(args.nodes)) + "|")
    with torch.inference_mode():
        for implementation in TREE_ATTENTION:
            target.set_attn_implementation(implementation)
            for context in args.contexts:
                for path, measure in (("tree", verification_ms), ("full mask", full_mask_ms)):
                    cells = measure(target, context, args.nodes, args.repeats)
                    row = " | ".join(f"{c:.2f}" for c in cells)
                    print(f"| {implementation} | {path} | {context} | {row} |")
    target.set_attn_implementation("sdpa")


if __name__ == "__main__":
    main()
