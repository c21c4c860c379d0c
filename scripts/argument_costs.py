"""What `generate`'s own arguments cost: stop strings, a Python stopping criterion, a custom logits processor, scores.

Decodes the demo pair's image suite with each set of arguments, through the target's own `generate` and through
vlmspec's default policy, one prompt at a time and as padded batches; checks that every output is the target's
own, and prints the median wall time of each and the speed-up, beside the speed-up without any argument. The
stop strings and the criterion never fire on these prompts, so every run decodes the same tokens and the times
differ only by what checking them costs.

Usage: .venv/bin/python scripts/argument_costs.py [--n 8] [--batch-size 1,4] [--max-new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from vlmspec.api import load_pair
from vlmspec.eval.bench import suite_inputs
from vlmspec.eval.profile import EndsWithToken, NoImmediateRepeat


def argument_sets(tokenizer) -> dict[str, dict]:
    return {
        "none": {},
        "stop_strings": dict(stop_strings=["###", "</answer>"], tokenizer=tokenizer),
        "stopping_criteria (Python)": dict(stopping_criteria=StoppingCriteriaList([EndsWithToken()])),
        "logits_processor (custom)": dict(logits_processor=LogitsProcessorList([NoImmediateRepeat()])),
        "output_scores + output_logits": dict(return_dict_in_generate=True, output_scores=True, output_logits=True),
    }


def sequences(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.sequences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--batch-size", default="1,4")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = load_pair()
    prompts = suite_inputs(spec.processor, "image", args.n)
    pad = spec.processor.tokenizer.pad_token_id
    adapter = spec._target_runner.adapter
    print(
        f"demo pair, image suite, {args.n} prompts, {args.max_new_tokens} new tokens, greedy, on {spec.target.device}"
    )
    print("| arguments | B | generate s | vlmspec s | speed-up | exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, extra in argument_sets(spec.processor.tokenizer).items():
        kwargs = dict(do_sample=False, max_new_tokens=args.max_new_tokens, **extra)
        for size in [int(b) for b in args.batch_size.split(",")]:
            batches = [adapter.join_rows(prompts[i : i + size], pad) for i in range(0, len(prompts), size)]
            times: dict[str, list[float]] = {"generate": [], "vlmspec": []}
            exact = True
            for turn in range(args.repeats):
                outputs = {}
                order = ("generate", "vlmspec") if turn % 2 == 0 else ("vlmspec", "generate")
                for method in order:
                    run = spec.target.generate if method == "generate" else spec.generate
                    started = time.perf_counter()
                    outputs[method] = [sequences(run(**batch, **kwargs)) for batch in batches]
                    times[method].append(time.perf_counter() - started)
                exact &= all(torch.equal(a, b) for a, b in zip(outputs["generate"], outputs["vlmspec"], strict=True))
            plain, spec_s = statistics.median(times["generate"]), statistics.median(times["vlmspec"])
            print(f"| {name} | {size} | {plain:.2f} | {spec_s:.2f} | {plain / spec_s:.2f}x | {exact} |")


if __name__ == "__main__":
    main()
