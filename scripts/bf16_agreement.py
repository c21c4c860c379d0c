"""How often output in bfloat16 equals the target's own `generate`: vlmspec next to HF assisted generation.

In bf16 a tree-batched forward can differ from one-token decoding in the last bits and flip a near-tie; HF
assisted generation verifies a chain in one forward and meets the same arithmetic. Pairs: the replicas of the
released checkpoints (random weights, released files; Qwen3-VL with do_sample=False) and the trained demo pair.
Usage: python scripts/bf16_agreement.py [--n 24] [--max-new-tokens 32] [--device cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from vlmspec import SpeculativeVLM
from vlmspec.demo_models import demo_pair
from vlmspec.eval.bench import suite_inputs
from vlmspec.testing import chat_inputs, sample_image
from vlmspec.testing.replicas import write_replicas

PROMPTS = ("Describe the image in detail.", "What is shown here?", "What colour is the largest shape?")


def replica_inputs(spec: SpeculativeVLM, n: int) -> list[dict[str, Any]]:
    """`n` prompts: a third text only, the rest with a small image of varying size."""
    out = []
    for i in range(n):
        images = [] if i % 3 == 0 else [sample_image(i, (32 + 8 * (i % 5), 48 + 8 * (i % 4)))]
        out.append(chat_inputs(spec.processor, PROMPTS[i % len(PROMPTS)], images=images))
    return out


def agreement(spec: SpeculativeVLM, inputs: list[dict[str, Any]], max_new_tokens: int) -> tuple[int, int | str]:
    """Items whose ids equal the target's generate: for vlmspec, and for HF assisted generation (or why it failed)."""
    samples = spec.target.generation_config.do_sample and spec.target.generation_config.top_k != 1
    settings = dict(max_new_tokens=max_new_tokens, **({"do_sample": False} if samples else {}))
    assisted: dict[str, Any] = {"assistant_model": spec.draft}
    if spec.target.config.get_text_config().vocab_size != spec.draft.config.get_text_config().vocab_size:
        # HF treats heads of different sizes as different tokenizers and asks for both (universal assisted decoding).
        tokenizer = spec.processor.tokenizer
        assisted.update(tokenizer=tokenizer, assistant_tokenizer=tokenizer)
    ours, hf = 0, 0
    for item in inputs:
        reference = spec.target.generate(**item, **settings)
        ours += int(torch.equal(spec.generate(**item, **settings), reference))
        if isinstance(hf, str):
            continue
        try:
            hf += int(torch.equal(spec.target.generate(**item, **assisted, **settings), reference))
        except Exception as error:  # HF refuses some pairs; report why
            hf = f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
    return ours, hf


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="also write the table as results.md and the counts as results.json here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    lines = [
        f"bfloat16 on {device}, {args.max_new_tokens} new tokens per item",
        "",
        "| pair | items | vlmspec equals generate | HF assisted equals generate |",
        "| --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        pairs = {f"replica {name}": paths for name, paths in write_replicas(root).items()}
        pairs["demo pair"] = tuple(str(p) for p in demo_pair())
        for name, (target, draft) in pairs.items():
            spec = SpeculativeVLM.from_pretrained(
                target, draft, torch_dtype=torch.bfloat16, device_map={"": str(device)}
            )
            if name == "demo pair":
                inputs = suite_inputs(spec.processor, "image", args.n // 2) + suite_inputs(
                    spec.processor, "video", args.n - args.n // 2
                )
            else:
                inputs = replica_inputs(spec, args.n)
            inputs = [{k: v.to(device) for k, v in item.items()} for item in inputs]
            ours, hf = agreement(spec, inputs, args.max_new_tokens)
            hf_text = f"{hf}/{len(inputs)}" if isinstance(hf, int) else hf
            lines.append(f"| {name} | {len(inputs)} | {ours}/{len(inputs)} | {hf_text} |")
            print(lines[-1], flush=True)
            rows.append({"pair": name, "items": len(inputs), "vlmspec_equal": ours, "hf_assisted_equal": hf})
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("\n".join(lines) + "\n")
        report = {"settings": {**vars(args), "device": str(device)}, "pairs": rows}
        (out / "results.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
