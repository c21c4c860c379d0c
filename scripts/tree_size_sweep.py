"""How much tree size matters on this machine: tokens/s of fixed tree shapes, SAGE variants and sage-gt.

Every configuration decodes the same held-out items of the demo pair's suite greedily, one configuration after
another, twice over in opposite orders; the table gives each one's mean tokens/s and its spread between the passes.
Usage: .venv/bin/python scripts/tree_size_sweep.py [--suite image|video] [--n N] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import time

import torch

from vlmspec import ChainPolicy, SageConfig
from vlmspec.api import load_pair
from vlmspec.eval.bench import suite_inputs


def configurations() -> list[tuple[str, object]]:
    """Chains of 4-10 tokens, SAGE with other maximum depths and thresholds, SAGE itself and sage-gt."""
    configs: list[tuple[str, object]] = [(f"chain {n}", ChainPolicy(n)) for n in (4, 6, 8, 10)]
    for depth in (6, 8, 12):
        for scale in (0.05, 0.1, 0.3):
            name = f"sage D_max {depth}, c {scale}"
            configs.append((name, SageConfig(depth_max=depth, threshold_scale=scale, depth_max_ceiling=max(12, depth))))
    return configs + [("sage (defaults)", "sage"), ("sage-gt", "sage-gt")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["image", "video"], default="video")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    args = parser.parse_args()
    torch.set_num_threads(2)
    pair = load_pair(torch_dtype=torch.float32)
    items = suite_inputs(pair.processor, args.suite, args.n)
    configs = configurations()
    runners = {name: pair.with_options(policy) for name, policy in configs}
    rates: dict[str, list[float]] = {name: [] for name, _ in configs}
    for order in (configs, configs[::-1]):
        for name, _ in order:
            spec = runners[name]
            spec.generate(**items[0], max_new_tokens=16, do_sample=False)
            seconds, tokens = 0.0, 0
            for inputs in items:
                start = time.perf_counter()
                spec.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
                seconds += time.perf_counter() - start
                tokens += spec.last_stats.new_tokens
            rates[name].append(tokens / seconds)
    best = max(sum(r) / len(r) for r in rates.values())
    print("| configuration | tokens/s | passes | relative to the best |\n| --- | --- | --- | --- |")
    for name, values in rates.items():
        mean = sum(values) / len(values)
        passes = " / ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {mean:.1f} | {passes} | {mean / best:.2f} |")


if __name__ == "__main__":
    main()
