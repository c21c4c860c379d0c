"""A conversation's second turn on the demo pair, from each one's own cache against the whole conversation again:
`generate` and vlmspec (`--policy`, default sage), seconds (median of `--repeats` calls), prompt tokens each model
runs, tau, and whether every second turn equals `generate` going on from its own cache. Then the default policy's
first calls of the process come first, with their steps, so a fresh process's first calls can be read too.

    python scripts/conversation_turns.py --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from PIL import Image

from vlmspec.api import load_pair

SAMPLE = Path(__file__).resolve().parents[1] / "vlmspec" / "demo_models" / "samples" / "sample.png"
FOLLOW_UP = "\n<|im_start|>user\nWhat colour is the triangle?<|im_end|>\n<|im_start|>assistant\n"


def timed(call, repeats: int) -> tuple[torch.Tensor, float]:
    """The output of `call` and the median of `repeats` calls' seconds."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = call()
        seconds.append(time.perf_counter() - started)
    return out, statistics.median(seconds)


def first_calls(spec, inputs, new_tokens: int) -> None:
    """The default policy's first three calls of the process on the first turn: seconds, steps, plain steps, tau."""
    for call in range(3):
        out, seconds = timed(lambda: spec.generate(**inputs, max_new_tokens=new_tokens, do_sample=False), 1)
        stats = spec.last_stats
        print(
            f"default, call {call + 1}: {seconds:.2f} s, {stats.iterations} steps, {stats.plain_steps} plain, "
            f"tau {stats.mean_accept_length:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policy", default="sage")
    args = parser.parse_args()
    spec = load_pair()
    target, n = spec.target, args.max_new_tokens
    inputs = spec.processor.prompt_inputs("Describe the image.", images=[Image.open(SAMPLE)])
    first_calls(spec, inputs, n)
    spec = spec.with_options(args.policy)
    mine = spec.generate(**inputs, max_new_tokens=n, return_dict_in_generate=True, do_sample=False)
    theirs = target.generate(**inputs, max_new_tokens=n, return_dict_in_generate=True, do_sample=False)
    ids = torch.cat([mine.sequences, spec.processor.tokenizer(FOLLOW_UP, return_tensors="pt").input_ids], 1)
    types = inputs["mm_token_type_ids"]
    turn = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    turn["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, ids.shape[1] - types.shape[1])], 1)
    whole = {**inputs, **turn}
    kwargs = dict(max_new_tokens=n, do_sample=False)
    reference, gen_cache = timed(
        lambda: target.generate(**turn, cache=copy.deepcopy(theirs.cache), **kwargs), args.repeats
    )
    _, gen_whole = timed(lambda: target.generate(**whole, **kwargs), args.repeats)
    from_cache, spec_cache = timed(lambda: spec.generate(**turn, cache=mine.cache, **kwargs), args.repeats)
    cached = spec.last_stats
    again, spec_whole = timed(lambda: spec.generate(**whole, **kwargs), args.repeats)
    read_again = spec.last_stats
    new = reference.shape[1] - ids.shape[1]
    print(
        f"conversation {ids.shape[1]} tokens, {new} new; every second turn equals generate's from its cache: "
        f"{torch.equal(from_cache, reference) and torch.equal(again, reference)}"
    )
    print("| second turn | seconds | tokens/s | target / draft prompt tokens | tau |\n| --- | --- | --- | --- | --- |")
    print(f"| `generate`, whole conversation | {gen_whole:.3f} | {new / gen_whole:.0f} | {ids.shape[1]} / - | - |")
    print(
        f"| `generate`, from its cache | {gen_cache:.3f} | {new / gen_cache:.0f} | "
        f"{ids.shape[1] - theirs.sequences.shape[1] + 1} / - | - |"
    )
    for label, seconds, stats in (
        ("whole conversation", spec_whole, read_again),
        ("from its cache", spec_cache, cached),
    ):
        print(
            f"| vlmspec ({args.policy}), {label} | {seconds:.3f} | {new / seconds:.0f} | "
            f"{stats.target_prefill_tokens} / {stats.draft_prefill_tokens} | {stats.mean_accept_length:.2f} |"
        )


if __name__ == "__main__":
    main()
