r"""Train the bundled demo pair on the synthetic captioning suite and ship it inside the package.

    python -m vlmspec.eval.train_demo [--steps N] [--time-budget MINUTES] [--out DIR]
    python -m vlmspec.eval.train_demo --init-from vlmspec/demo_models --first-item 12800 --steps 400
    python -m vlmspec.eval.train_demo --init-from vlmspec/demo_models --first-item 21344 --device cuda \
        --long-video-share 0.5 --workers 12 --steps 600 --out DIR

The second form continues training a saved pair on items it has not seen. The third does so on a GPU (bfloat16
autocast over float32 weights) and renders half of the training clips as the bench's long videos (32 frames at
336 px, 2,304 visual tokens each, with the video processors' default pixel budget), so that the pair also captions
the `long-video` suite; 12 loader processes render and process the batches while the GPU trains.
Trains a Qwen2.5-VL-architecture target (~20 M language-model parameters) and draft (~0.55 M) side by side on
the same batches, prints progress, scores both models' greedy captions on the bench's held-out items of each suite
(`image`, `video`, `long-video`: count, colour, shape accuracy), and writes both in bfloat16 safetensors with the
processor files, plus a sample image and video.
On 2 CPU cores a step of 16 short items (about 2,400 tokens) takes about 4-5 s, and one of 4 items with long clips
among them (padded to about 10,000 tokens) about 25 s; see `training_log.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import Qwen2_5_VLForConditionalGeneration

from ..demo_models import DEMO_DIR
from ..processors import chat_messages
from .accuracy import score_caption, summarize
from .bench import LONG_VIDEO_FRAMES, LONG_VIDEO_SIZE, SUITES, long_video_processor, suite_inputs, suite_items
from .demo_pair import DRAFT, TARGET, build_demo_processor, build_demo_tokenizer, build_model, language_model_parameters
from .synthetic import VIDEO_FPS, Item, items, make_item, write_clip


def is_long_video(seed: int, share: float) -> bool:
    """Whether the training video of `seed` is rendered as a long clip: a draw from a generator of its own seeded by
    `seed` (not the caption's), so every run and every loader process makes the same choice."""
    return share > 0 and random.Random(f"long-video {seed}").random() < share


def collate(rows: list[tuple[Any, Item]]) -> dict[str, torch.Tensor]:
    """Right-padded inputs for a batch of (processor, item) rows, with labels on the caption and its end-of-turn
    token only."""
    tokenizer = rows[0][0].tokenizer
    encoded = []
    for processor, item in rows:
        images, videos = ([item.image], []) if item.kind == "image" else ([], [item.video])
        prompt = processor.apply_chat_template(chat_messages(item.prompt, len(images), len(videos)))
        answer = item.caption + tokenizer.eos_token
        inputs = processor(prompt + answer, images=images, videos=videos, video_fps=VIDEO_FPS)
        n_answer = len(tokenizer(answer, add_special_tokens=False)["input_ids"])
        labels = inputs["input_ids"].clone()
        labels[:, :-n_answer] = -100
        encoded.append((inputs, labels))
    width = max(r[0]["input_ids"].shape[1] for r in encoded)

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    out = {
        "input_ids": torch.cat([pad(r[0]["input_ids"], tokenizer.pad_token_id) for r in encoded]),
        "attention_mask": torch.cat([pad(r[0]["attention_mask"], 0) for r in encoded]),
        "mm_token_type_ids": torch.cat([pad(r[0]["mm_token_type_ids"], 0) for r in encoded]),
        "labels": torch.cat([pad(r[1], -100) for r in encoded]),
    }
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        parts = [r[0][key] for r in encoded if key in r[0]]
        if parts:
            out[key] = torch.cat(parts)
    return out


class TrainBatches(Dataset):
    """The run's training batches, indexed by step: batch `step` holds items `first_item + step * batch_size` on,
    a `long_video_share` of their videos rendered as long clips (same seed: same scene and caption) and processed
    with the video processors' default pixel budget. Built from the index alone, so any number of loader processes
    gives the same batches in the same order."""

    def __init__(self, processor, steps: int, batch_size: int, first_item: int = 0, long_video_share: float = 0.0):
        self.processor = processor
        self.long_processor = long_video_processor(processor)
        self.steps = steps
        self.batch_size = batch_size
        self.first_item = first_item
        self.long_video_share = long_video_share

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        rows = []
        for item in items("train", self.batch_size, start=self.first_item + step * self.batch_size):
            if item.kind == "video" and is_long_video(item.seed, self.long_video_share):
                rows.append((self.long_processor, make_item(item.seed, "video", LONG_VIDEO_FRAMES, LONG_VIDEO_SIZE)))
            else:
                rows.append((self.processor, item))
        return collate(rows)


def batch_loader(batches: TrainBatches, workers: int, pin_memory: bool = False) -> DataLoader:
    """The batches in step order, built by `workers` processes (0: inline). One pass over the run, so the processes
    need not persist; each keeps two batches ready, which covers a step's jitter without holding many long clips'
    pixels in shared memory. Its own random generator leaves the global one as it was (the batches use none)."""
    return DataLoader(
        batches,
        batch_size=None,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        pin_memory=pin_memory,
        generator=torch.Generator(),
    )


def schedule(step: int, total: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_step(model, optimizer, batch: dict[str, torch.Tensor], device: torch.device) -> float:
    """One optimiser step on `batch`; on CUDA the forward runs under bfloat16 autocast (the weights and the optimiser
    stay float32, and the backward follows the forward's dtypes). Returns the loss."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def held_out_inputs(processor, suite: str, n: int) -> list[tuple[Item, dict[str, torch.Tensor]]]:
    """The bench's first `n` held-out items of `suite`, each with its processed inputs (made once, for every model
    evaluated on them)."""
    return list(zip(suite_items(suite, n), suite_inputs(processor, suite, n), strict=True))


def evaluate(
    model, processor, held_out: list[tuple[Item, dict[str, torch.Tensor]]], device: torch.device, max_new_tokens: int
) -> dict[str, float]:
    """Accuracy of the model's greedy captions (in float32, on `device`) on `held_out` items and their inputs."""
    model.eval()
    scores = []
    for item, inputs in held_out:
        inputs = {k: v.to(device) for k, v in inputs.items()}
        ids = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        text = processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        scores.append(score_caption(item, text))
    model.train()
    return summarize(scores)


def write_samples(out: Path) -> None:
    """A held-out image (PNG) and video (MP4, 8 frames at 2 fps) for the demo command."""
    samples = out / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    make_item(items("held-out", 1)[0].seed, "image").image.save(samples / "sample.png")
    video = make_item(items("held-out", 2)[1].seed, "video").video
    write_clip(samples / "sample.mp4", video, VIDEO_FPS, bit_rate=4_000_000)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train and ship the vlmspec demo pair.")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--time-budget", type=float, default=None, help="stop after this many minutes")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument(
        "--eval-items",
        type=int,
        default=12,
        help="held-out items per suite (image, video, long-video), the bench's first ones",
    )
    parser.add_argument("--eval-max-new-tokens", type=int, default=220, help="caption length the evaluation allows")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEMO_DIR)
    parser.add_argument(
        "--init-from", type=Path, default=None, help="continue from a saved pair (its target/ and draft/)"
    )
    parser.add_argument("--first-item", type=int, default=0, help="index of the first training item (to see new ones)")
    parser.add_argument(
        "--device",
        type=torch.device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the models train and are evaluated (bfloat16 autocast on CUDA)",
    )
    parser.add_argument(
        "--long-video-share",
        type=float,
        default=0.0,
        help=f"share of the training videos rendered long ({LONG_VIDEO_FRAMES} frames at {LONG_VIDEO_SIZE} px)",
    )
    parser.add_argument("--workers", type=int, default=0, help="processes that build the batches (0: inline)")
    args = parser.parse_args()
    if not 0.0 <= args.long_video_share <= 1.0:
        parser.error("--long-video-share must lie in [0, 1]")
    return args


def main() -> None:
    args = parse_args()
    if importlib.util.find_spec("av") is None:
        # Checked first, so a run is not lost at its end: the sample video is written with PyAV.
        raise SystemExit("train_demo writes the demo's sample video with PyAV, which is not installed (pip install av)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_demo_tokenizer()
    processor = build_demo_processor(tokenizer)
    models = _initial_models(args, tokenizer)
    lrs = {"target": args.lr, "draft": args.draft_lr}
    optimizers = {
        k: torch.optim.AdamW(m.parameters(), lr=lrs[k], weight_decay=0.01, betas=(0.9, 0.98)) for k, m in models.items()
    }
    _print_sizes(models)
    log = {"args": {k: str(v) for k, v in vars(args).items()}, "steps": []}
    _train(args, processor, models, optimizers, lrs, log)
    _score_held_out(args, processor, models, log)
    for name, model in models.items():
        target_dir = args.out / name
        model.eval().to(torch.bfloat16).save_pretrained(target_dir)
        processor.save_pretrained(target_dir)
    (args.out / "training_log.json").write_text(json.dumps(log, indent=1))
    write_samples(args.out)
    print(f"wrote the demo pair to {args.out}", flush=True)


def _initial_models(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """The target and draft to train, built afresh or loaded from `--init-from`, on `--device` in training mode."""
    if args.init_from is None:
        models = {"target": build_model(tokenizer, TARGET), "draft": build_model(tokenizer, DRAFT)}
    else:
        models = {
            name: Qwen2_5_VLForConditionalGeneration.from_pretrained(args.init_from / name, dtype=torch.float32)
            for name in ("target", "draft")
        }
    for model in models.values():
        model.to(args.device).train()
    return models


def _print_sizes(models: dict[str, Any]) -> None:
    """Each model's language-model and total parameters, in millions."""
    for name, model in models.items():
        print(
            f"{name}: {language_model_parameters(model) / 1e6:.2f} M language-model parameters, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M in all",
            flush=True,
        )


def _train(
    args: argparse.Namespace,
    processor: Any,
    models: dict[str, Any],
    optimizers: dict[str, torch.optim.Optimizer],
    lrs: dict[str, float],
    log: dict[str, Any],
) -> None:
    """Both models trained side by side on the same batches until `--steps` or the time budget, each step's losses
    and the training's steps, minutes and (on CUDA) peak memory recorded in `log`."""
    device = args.device
    batches = TrainBatches(processor, args.steps, args.batch_size, args.first_item, args.long_video_share)
    started = time.perf_counter()
    step = 0
    for step, batch in enumerate(batch_loader(batches, args.workers, pin_memory=device.type == "cuda")):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        losses = {}
        for name, model in models.items():
            for group in optimizers[name].param_groups:
                group["lr"] = lrs[name] * schedule(step, args.steps, args.warmup)
            losses[name] = train_step(model, optimizers[name], batch, device)
        elapsed = time.perf_counter() - started
        log["steps"].append(
            {"step": step + 1, "seconds": round(elapsed, 1), **{f"{k}_loss": round(v, 4) for k, v in losses.items()}}
        )
        if (step + 1) % args.log_every == 0 or step == 0:
            rate = elapsed / (step + 1)
            print(
                f"step {step + 1}/{args.steps}  target loss {losses['target']:.3f}  draft loss {losses['draft']:.3f}  "
                f"{rate:.2f} s/step  elapsed {elapsed / 60:.1f} min  eta {rate * (args.steps - step - 1) / 60:.1f} min",
                flush=True,
            )
        if args.time_budget is not None and elapsed > args.time_budget * 60:
            print(f"time budget of {args.time_budget} min reached after {step + 1} steps", flush=True)
            break
    log["trained_steps"] = step + 1
    log["train_minutes"] = round((time.perf_counter() - started) / 60, 1)
    if device.type == "cuda":
        log["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        print(f"peak GPU memory in training: {log['peak_gpu_memory_gib']:.2f} GiB", flush=True)


def _score_held_out(args: argparse.Namespace, processor: Any, models: dict[str, Any], log: dict[str, Any]) -> None:
    """Both models' greedy captions of the held-out items of every suite scored, into `log` and printed."""
    started = time.perf_counter()
    held_out = {suite: held_out_inputs(processor, suite, args.eval_items) for suite in SUITES}
    log["held_out_accuracy"] = {
        name: {
            suite: evaluate(model, processor, held_out[suite], args.device, args.eval_max_new_tokens)
            for suite in SUITES
        }
        for name, model in models.items()
    }
    log["eval_minutes"] = round((time.perf_counter() - started) / 60, 1)
    print("held-out caption accuracy:", json.dumps(log["held_out_accuracy"], indent=2), flush=True)


if __name__ == "__main__":
    main()
