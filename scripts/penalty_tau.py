"""Mean acceptance length with and without a repetition penalty, on the demo pair and with the target as its own draft.

The draft proposes from logits processed like the target's, so a penalty should leave tau where it was.
Usage: python scripts/penalty_tau.py [--n 4] [--max-new-tokens 96] [--penalty 1.05]
"""

from __future__ import annotations

import argparse

import torch

from vlmspec import SpeculativeVLM, load_pair
from vlmspec.eval.bench import run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--penalty", type=float, default=1.05)
    args = parser.parse_args()
    torch.manual_seed(0)
    demo = load_pair()
    pairs = {"demo pair": demo, "target as draft": SpeculativeVLM(demo.target, demo.target, processor=demo.processor)}
    print("| draft | suite | method | tau, no penalty | tau, penalty | exact match |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, spec in pairs.items():
        for suite in ("image", "video"):
            runs = [
                run_bench(spec, suite, ["chain", "sage"], args.n, args.max_new_tokens, False, generation)
                for generation in ({}, {"repetition_penalty": args.penalty})
            ]
            for method in ("chain", "sage"):
                plain, penalised = (r["methods"][method] for r in runs)
                exact = min(plain["exact_match"], penalised["exact_match"])
                print(f"| {name} | {suite} | {method} | {plain['tau']:.2f} | {penalised['tau']:.2f} | {exact:.2f} |")


if __name__ == "__main__":
    main()
