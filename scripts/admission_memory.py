"""Peak memory of admitting one long video prompt with the demo pair on the CPU: the most bytes torch held at once
while `generate` prefilled the prompt and took it into the batch (two new tokens, so the row is admitted), measured
by torch's profiler, and the bytes of the prompt's keys and values in each model, for comparison.

Usage: python scripts/admission_memory.py [--frames 32] [--size 336]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from vlmspec.api import load_pair
from vlmspec.testing.common import chat_inputs, sample_frames


def peak_bytes(events) -> int:
    """The most bytes allocated at once over the profiled run, from the profiler's allocation events in time order."""
    held = peak = 0
    for event in sorted(events, key=lambda e: e.time_range.start):
        if event.name == "[memory]":
            held += event.cpu_memory_usage
            peak = max(peak, held)
    return peak


def kv_bytes(model: torch.nn.Module, tokens: int) -> int:
    """Bytes of `tokens` positions of keys and values over all of `model`'s layers."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    return per_token * tokens * model.get_input_embeddings().weight.element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--size", type=int, default=336)
    args = parser.parse_args()
    spec = load_pair(compile="off")
    video = sample_frames(0, num_frames=args.frames, size=(args.size, args.size))
    inputs = chat_inputs(spec.processor, "Describe the video.", video=video)
    tokens = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        spec.generate(**inputs, max_new_tokens=2, do_sample=False)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as run:
            spec.generate(**inputs, max_new_tokens=2, do_sample=False)
    print(f"prompt tokens: {tokens}")
    print(f"target KV of the prompt: {kv_bytes(spec.target, tokens) / 2**20:.1f} MiB")
    print(f"draft KV of the prompt (unpruned): {kv_bytes(spec.draft, tokens) / 2**20:.1f} MiB")
    print(f"peak allocated during generate: {peak_bytes(run.events()) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
