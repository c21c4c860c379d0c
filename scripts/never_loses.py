"""The default never loses: where drafts do not pay it decodes at plain `generate`'s speed, where they pay at SAGE's.

Cases (demo target, greedy, one process, every output checked against plain `generate`):
- a draft that does not match the target: the demo draft's architecture with random weights, on the image, video and
  long-video suites (the long-video clips also stand for contexts past what a draft handles);
- the demo pair itself on the same suites, where drafts pay: the default against `sage`, its speed-up kept.
Each case runs one sequence at a time (the items in turns: `generate`, the default, then `sage` where timed, each
method starting from the next one on the following item) and 8 sequences at once (plain `generate` on left-padded
batches of 8 against `SpeculativeVLM.stream` with 8 in flight), `--repeats` times, the median kept. Each method is
warmed up untimed on the first item first (the default's measured costs are kept across calls, as in a process that
serves or captions many items). Prints a markdown table: speed against plain `generate` (tokens per second,
B = 1 and B = 8), exact outputs, and the default's steps that ran plain, and why.

Usage: .venv/bin/python scripts/never_loses.py [--n 8] [--max-new-tokens 96] [--repeats 3] [--suites image,video]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch

from vlmspec import SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.eval.batch_bench import generate_batches
from vlmspec.eval.bench import machine_description, suite_inputs
from vlmspec.eval.demo_pair import DRAFT, build_model

BATCH = 8


def random_draft(spec: SpeculativeVLM, seed: int = 0) -> torch.nn.Module:
    """The demo draft's architecture with random weights: a draft that does not match the target."""
    torch.manual_seed(seed)
    return build_model(spec.processor.tokenizer, DRAFT).to(spec.target.device).eval()


def run_case(spec: SpeculativeVLM, suite: str, n: int, max_new_tokens: int, repeats: int, with_sage: bool) -> dict:
    """Median seconds of each method at B = 1 and B = 8 over the suite's first `n` items, exactness and plain steps."""
    generation = dict(do_sample=False, max_new_tokens=max_new_tokens)
    inputs = suite_inputs(spec.processor, suite, n + 1)
    warm, inputs = inputs[0], inputs[1:]
    target, device = spec.target, spec.target.device
    adapter, pad = spec._target_runner.adapter, spec.processor.tokenizer.pad_token_id
    methods = {"default": spec.with_options()}
    if with_sage:
        methods["sage"] = spec.with_options("sage")
    target.generate(**warm, **generation)
    generate_batches(target, adapter, [warm] * 2, 2, pad, device, generation)
    for runner in methods.values():
        runner.generate(**warm, **generation)
        list(runner.stream(enumerate([warm] * 2), batch_size=2, **generation))
    references = [target.generate(**item, **generation)[0] for item in inputs]
    names = ["generate", *methods]
    seconds = {(name, b): [] for name in names for b in (1, BATCH)}
    exact = Counter()
    plain, steps, reasons = 0, 0, Counter()
    for turn in range(repeats):
        totals = dict.fromkeys(names, 0.0)
        for i, item in enumerate(inputs):
            shift = (turn + i) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                if name == "generate":
                    out = target.generate(**item, **generation)[0]
                else:
                    out = methods[name].generate(**item, **generation)[0]
                totals[name] += time.perf_counter() - start
                exact[name, 1] += torch.equal(out, references[i])
                if name == "default" and turn == 0:
                    stats = methods[name].last_stats
                    plain, steps = plain + stats.plain_steps, steps + len(stats.steps)
                    reasons.update(stats.plain_reasons)
        for name in names:
            seconds[name, 1].append(totals[name])
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            if name == "generate":
                rows = generate_batches(target, adapter, inputs, BATCH, pad, device, generation)
            else:
                results = methods[name].stream(enumerate(inputs), batch_size=BATCH, **generation)
                rows = [r.sequence[0] for r in sorted(results, key=lambda r: r.key)]
            seconds[name, BATCH].append(time.perf_counter() - start)
            exact[name, BATCH] += sum(_same(row, ref, pad) for row, ref in zip(rows, references, strict=True))
    median = {key: statistics.median(values) for key, values in seconds.items()}
    runs = repeats * len(inputs)
    return {
        "speed": {(name, b): median["generate", b] / median[name, b] for name in methods for b in (1, BATCH)},
        "exact": {key: (count, runs) for key, count in exact.items()},
        "plain": (plain, steps, dict(reasons)),
    }


def _same(row: torch.Tensor, reference: torch.Tensor, pad: int | None) -> bool:
    """Whether a batch's row (its left padding removed, its padding after an EOS kept) equals `reference`."""
    return torch.equal(row[: reference.shape[0]].cpu(), reference.cpu())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--suites", default="image,video,long-video")
    args = parser.parse_args()
    pair = load_pair()
    mismatched = SpeculativeVLM(pair.target, random_draft(pair), processor=pair.processor)
    print(
        f"demo target, greedy, {args.n} items a case, {args.max_new_tokens} new tokens, median of {args.repeats}, "
        f"on {machine_description(pair.target.device)}\n"
    )
    print(
        "| draft | suite | default vs generate, B=1 | B=8 | sage vs generate, B=1 | B=8 | default vs sage, B=1 | B=8 | "
        "exact | default's plain steps |"
    )
    print("| --- " * 10 + "|")
    for label, spec in (("random weights", mismatched), ("demo pair", pair)):
        for suite in args.suites.split(","):
            case = run_case(spec, suite, args.n, args.max_new_tokens, args.repeats, with_sage=True)
            speed, (plain, steps, reasons) = case["speed"], case["plain"]
            exact = ", ".join(f"{name} B={b} {c}/{r}" for (name, b), (c, r) in sorted(case["exact"].items()))
            why = "; ".join(f"{reason}: {count}" for reason, count in reasons.items()) or "-"
            cells = [f"{speed['default', b]:.2f}x" for b in (1, BATCH)] + [
                f"{speed['sage', b]:.2f}x" for b in (1, BATCH)
            ]
            cells += [f"{speed['default', b] / speed['sage', b]:.2f}x" for b in (1, BATCH)]
            print(f"| {label} | {suite} | {' | '.join(cells)} | {exact} | {plain} of {steps} ({why}) |", flush=True)


if __name__ == "__main__":
    main()
