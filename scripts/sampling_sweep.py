"""G tests of speculative sampling against the target's exact distribution, over the whole grid.

Every policy (chain, static-tree, sage) x draft (the target itself, an independent model, a noisy copy) x input
(text, image, video) x warper (temperature alone, top-k with top-p), on a tiny Qwen2.5-VL pair: the exact
distribution of every continuation is enumerated with the target's own `generate(do_sample=True)`, and
`--samples` seeded speculative continuations are compared with it. Six new tokens take SAGE past its initial tree
into its entropy-shaped ones; prefixes less likely than the warper's minimum mass stand for all their
continuations. Prints a markdown table; exits 1 if any G test falls below `--alpha`.

    .venv/bin/python scripts/sampling_sweep.py --samples 2000 --new-tokens 6
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch

from vlmspec import SpeculativeVLM
from vlmspec.testing import TINY_FAMILIES, chat_inputs, noisy_copy, sample_frames, sample_image, tiny_qwen2_5_vl
from vlmspec.testing.distribution import continuations, eos_ids, exact_continuations, g_test

WARPS = {
    "temperature 0.7": (dict(temperature=0.7, top_k=0), 0.02),
    "top-k 4, top-p 0.9, temperature 1.5": (dict(temperature=1.5, top_k=4, top_p=0.9), 0.005),
}
POLICIES = ("chain", "static-tree", "sage")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--alpha", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    make_processor, make_target = TINY_FAMILIES["qwen2_5_vl"]
    processor, target = make_processor(), make_target()
    drafts = {
        "self": target,
        "independent": tiny_qwen2_5_vl(1, hidden_size=32, heads=2, kv_heads=1),
        "noisy": noisy_copy(target, 0.05),
    }
    cases = {
        "text": chat_inputs(processor, "Describe the image in detail."),
        "image": chat_inputs(processor, "Describe the image in detail.", images=[sample_image(0)]),
        "video": chat_inputs(processor, "Describe the video in detail.", video=sample_frames(0, num_frames=5)),
    }
    eos = eos_ids(target, {})
    print("| input | warpers | policy | draft | continuations | G | dof | p-value | tau | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = 0
    for (case, inputs), (warp_name, (warp, min_mass)) in itertools.product(cases.items(), WARPS.items()):
        exact = exact_continuations(target, inputs, args.new_tokens, min_mass, **warp)
        for policy, (draft_name, draft) in itertools.product(POLICIES, drafts.items()):
            started = time.perf_counter()
            spec = SpeculativeVLM(target, draft, policy=policy)
            sequences = spec.generate(
                **inputs,
                do_sample=True,
                max_new_tokens=args.new_tokens,
                num_return_sequences=args.samples,
                generator=torch.Generator().manual_seed(args.seed),
                **warp,
            )
            result = g_test(continuations(sequences, inputs["input_ids"].shape[1], eos), exact)
            failed += not result.passes(args.alpha)
            print(
                f"| {case} | {warp_name} | {policy} | {draft_name} | {len(exact)} | {result.statistic:.1f} | "
                f"{result.dof} | {result.p_value:.3f} | {spec.last_stats.mean_accept_length:.2f} | "
                f"{time.perf_counter() - started:.0f} |",
                flush=True,
            )
    print(f"\n{failed} of {len(cases) * len(WARPS) * len(POLICIES) * len(drafts)} G tests below alpha={args.alpha}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
