"""A short end-to-end example on tiny random models: speculative output equals the target's own greedy output.

Random weights say nothing about speed (here the draft is as large as the target, so expect < 1x); they show the
contract (same tokens) and what `last_stats` reports.
Usage: .venv/bin/python scripts/example_tiny.py
"""

from __future__ import annotations

import time

import torch

from vlmspec import SpeculativeVLM
from vlmspec.testing import noisy_copy, chat_inputs, sample_frames, sample_image, tiny_processor, tiny_qwen2_5_vl


def main() -> None:
    processor = tiny_processor()
    target = tiny_qwen2_5_vl(seed=0)
    draft = noisy_copy(target, scale=0.05)
    examples = {
        "image": chat_inputs(processor, "Describe the image in detail.", images=[sample_image(0)]),
        "video": chat_inputs(processor, "Describe the video in detail.", video=sample_frames(0, num_frames=8)),
    }
    for name, inputs in examples.items():
        start = time.perf_counter()
        reference = target.generate(**inputs, do_sample=False, max_new_tokens=64)
        ar_seconds = time.perf_counter() - start
        for policy in ("chain", "static-tree", "sage"):
            spec = SpeculativeVLM(target, draft, policy=policy)
            start = time.perf_counter()
            out = spec.generate(**inputs, max_new_tokens=64)
            seconds = time.perf_counter() - start
            stats = spec.last_stats
            print(
                f"{name:<6} {policy:<12} identical={torch.equal(out, reference)} tokens={stats.new_tokens} "
                f"steps={stats.iterations} tau={stats.mean_accept_length:.2f} speedup vs generate={ar_seconds / seconds:.2f}x"
            )


if __name__ == "__main__":
    main()
