r"""Distil a draft head in the EAGLE-3 layout for the demo target, quickly, on the synthetic captioning suite.

    python scripts/distill_head.py --out DIR [--steps 200] [--batch-size 8] [--unroll 3] [--seconds 600]

A head to measure the engine with, not the one to ship: it starts from a random head (`vlmspec.testing.heads`), reads
the target's features through the tap the engine decodes with, and fits each step's distribution to the target's
own (soft cross-entropy, as EAGLE-3 distils) on teacher-forced training captions, float32 on the CPU. It unrolls
`--unroll` steps as EAGLE-3's training-time test does: step k feeds token x[j+1+k] beside the head's own output of
step k-1 at j (the target's feature at j for k = 0), at x[j+k]'s position, attending to step 0's entries up to j and
to its own earlier steps' entries at j alone, which is what a tree level attends to at decoding; its target is the
target's distribution after x[j+1+k], weighted 0.8^k. Prints the loss as it goes and writes the head with
`save_head` (the released layout) to `--out`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen2_5_VLForConditionalGeneration

from vlmspec.adapters.registry import adapter_for
from vlmspec.demo_models import DEMO_DIR
from vlmspec.engine.features import FeatureTap
from vlmspec.eval.synthetic import items
from vlmspec.eval.train_demo import collate, schedule
from vlmspec.heads import save_head
from vlmspec.heads.fit import check_head
from vlmspec.processors.loading import load_processor
from vlmspec.testing.heads import random_head

STEP_WEIGHT = 0.8


def unrolled_mask(real: torch.Tensor, steps: int) -> torch.Tensor:
    """The additive mask `(B, 1, S, (steps + 1) S)` of unrolled step `steps` over every step's entries: causal over
    step 0's real entries, the diagonal over each later step's (an entry's own chain)."""
    length = real.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None] & real[:, None, :]
    diagonal = torch.eye(length, dtype=torch.bool)[None].expand(real.shape[0], -1, -1)
    allowed = torch.cat([causal, *[diagonal] * steps], dim=-1)[:, None]
    return torch.zeros(allowed.shape).masked_fill(~allowed, -torch.inf)


def shifted(t: torch.Tensor, by: int, dim: int) -> torch.Tensor:
    """`t` moved `by` entries earlier along `dim`, its last entries repeated (their losses are masked out)."""
    index = (torch.arange(t.shape[dim]) + by).clamp(max=t.shape[dim] - 1)
    return t.index_select(dim, index)


def unrolled_loss(head, batch: dict, features: torch.Tensor, teacher: torch.Tensor, positions, unroll: int):
    """The weighted soft cross-entropy of `unroll` unrolled steps over a right-padded batch: entry j of step k reads
    x[j+1+k] at x[j+k]'s position, its target the teacher's distribution after x[j+1+k], counted where the token
    it predicts, x[j+2+k], is a caption token (labelled)."""
    ids, labels, real = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
    predicts_caption = shifted(labels != -100, 1, 1)
    cache, feature, total = DynamicCache(config=head.config), features, 0.0
    for k in range(unroll):
        out = head(
            input_ids=shifted(ids, 1 + k, 1),
            position_ids=shifted(positions, k, 2),
            features=feature,
            attention_mask=unrolled_mask(real, k),
            cache=cache,
        )
        valid = shifted(predicts_caption & real, 1 + k, 1)
        valid[:, ids.shape[1] - 1 - k :] = False
        log_probs = torch.log_softmax(out.logits.float().clamp_min(-1e4), dim=-1)
        target = shifted(teacher, 1 + k, 1)
        loss = -(target * log_probs).sum(-1)
        total = total + STEP_WEIGHT**k * (loss * valid).sum() / valid.sum().clamp_min(1)
        feature = out.hidden_states
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--unroll", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    parser.add_argument("--first-item", type=int, default=40_000, help="the first training item's seed")
    args = parser.parse_args()
    target_dir = Path(DEMO_DIR) / "target"
    processor = load_processor(str(target_dir))
    target = Qwen2_5_VLForConditionalGeneration.from_pretrained(target_dir, dtype=torch.float32).eval()
    target.requires_grad_(False)
    head = random_head(target, seed=0, intermediate_size=target.config.get_text_config().intermediate_size).train()
    tap = FeatureTap.on(adapter_for(target).language_model, check_head(head, target))
    adapter = adapter_for(target)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    start = time.perf_counter()
    for step in range(args.steps):
        first = args.first_item + step * args.batch_size
        batch = collate([(processor, item) for item in items("train", args.batch_size, start=first)])
        with torch.no_grad():
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            teacher = torch.softmax(target(**inputs).logits.float(), dim=-1)
            features, positions = tap.take(), adapter.prompt_positions(inputs)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * schedule(step, args.steps, 10)
        loss = unrolled_loss(head, batch, features, teacher, positions, args.unroll)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps}  loss {float(loss.detach()):.3f}  {seconds:.0f} s", flush=True)
        if seconds > args.seconds:
            print(f"stopped at step {step + 1}: --seconds {args.seconds:.0f} reached", flush=True)
            break
    head = head.to(torch.bfloat16).eval()
    print(f"wrote {save_head(head, args.out)}")


if __name__ == "__main__":
    main()
