"""How a target forward's time grows with the tokens it carries: where batched decoding turns compute-bound.

Times one target forward (eager, as `generate` runs it) carrying B rows x q tokens over the demo prompt's cache, for
a range of token counts, and prints milliseconds per forward and per token. Once the time per token stops falling,
the forward is compute-bound: plain batched `generate` cannot emit faster than one token per token of compute, and a
speculative step, which verifies at least as many tokens as it emits, cannot either. The highest tokens per second
any forward reaches is the ceiling both share.

Usage: .venv/bin/python scripts/batch_roofline.py [--tokens 1,4,8,16,32,64,128,256,512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from vlmspec.api import load_pair
from vlmspec.eval.bench import suite_inputs


def forward_seconds(model: torch.nn.Module, inputs: dict, rows: int, tokens: int, repeats: int) -> float:
    """Median seconds of a forward of `rows` x `tokens` new tokens over a cache holding `rows` copies of the text
    prompt `inputs` (`input_ids`, `attention_mask`)."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        batch = {k: v.repeat(rows, 1) for k, v in inputs.items()}
        model(**batch, past_key_values=cache, use_cache=True)
        length = batch["input_ids"].shape[1]
        ids = torch.zeros(rows, tokens, dtype=torch.long, device=model.device)
        times = []
        for _ in range(repeats):
            positions = torch.arange(length, length + tokens, device=model.device).expand(rows, -1)
            start = time.perf_counter()
            model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
            cache.crop(-tokens)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,4,8,16,32,64,128,256,512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spec = load_pair(None, None, torch_dtype=torch.float32, compile="off")
    inputs = suite_inputs(spec.processor, "image", 1)[0]
    text_only = {k: inputs[k] for k in ("input_ids", "attention_mask")}
    print(f"demo target, {torch.get_num_threads()} threads, prompt of {inputs['input_ids'].shape[1]} tokens")
    print("| tokens per forward | rows x tokens | ms per forward | ms per token | tokens/s ceiling |")
    print("| --- | --- | --- | --- | --- |")
    for total in (int(t) for t in args.tokens.split(",")):
        rows = min(total, 32)
        per_row = max(1, total // rows)
        seconds = forward_seconds(spec.target, text_only, rows, per_row, args.repeats)
        count = rows * per_row
        ms = 1000 * seconds
        print(f"| {count} | {rows} x {per_row} | {ms:.1f} | {ms / count:.2f} | {count / seconds:.0f} |")


if __name__ == "__main__":
    main()
