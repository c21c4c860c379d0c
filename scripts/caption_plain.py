"""Caption a collection with the target alone, in plain batches of `transformers`' `generate`: the baseline that
`vlmspec caption` is measured against.

What one would write without vlmspec: load the target and its processor, then for each chunk of B inputs build the
left-padded batch with the processor, `target.generate(**batch, max_new_tokens=...)`, and write a JSON line per
input (`path`, `caption`, `new_tokens`; `path`, `error` for a file that cannot be read). Media are read in the main
thread, between batches; a batch ends when its longest caption does. Inputs are found as `vlmspec caption` finds
them (folders searched recursively, `.txt` lists of paths) and get the same default prompts; the target runs in the
dtype `vlmspec caption` gives it (float32 for the demo pair and on a CPU, the checkpoint's own on a GPU). Prints
inputs per minute and new tokens per second, model loading excluded.

Usage: .venv/bin/python scripts/caption_plain.py FOLDER... [--out captions-plain.jsonl] [--batch-size 8]
    [--max-new-tokens 256] [--model TARGET] [--num-frames N] [--dtype auto|float32|bfloat16|float16] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText

from vlmspec.captioning import DEFAULT_PROMPTS, INPUT_ERRORS, discover_inputs
from vlmspec.demo_models import DEMO_DIR
from vlmspec.processors import chat_messages, load_image, load_processor, load_video, media_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="files, folders (searched recursively) or .txt lists of paths")
    parser.add_argument("--out", default="captions-plain.jsonl")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--model", default=str(DEMO_DIR / "target"), help="target (default: the demo pair's)")
    parser.add_argument("--num-frames", type=int, help="frames per video (default: the model family's rule)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dtype = args.dtype or ("auto" if args.device != "cpu" and Path(args.model) != DEMO_DIR / "target" else "float32")
    dtype = dtype if dtype == "auto" else getattr(torch, dtype)

    target = AutoModelForImageTextToText.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    processor = load_processor(args.model)
    tokenizer = processor.tokenizer
    eos = target.generation_config.eos_token_id
    eos = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=args.device)
    paths = discover_inputs(args.inputs)

    started, captioned, new_tokens = time.perf_counter(), 0, 0
    with open(args.out, "w", encoding="utf-8") as out:
        for first in range(0, len(paths), args.batch_size):
            texts, images, videos, chunk = [], [], [], []
            for path in paths[first : first + args.batch_size]:
                try:
                    kind = media_kind(path)
                    if kind == "image":
                        medium = load_image(path)
                    else:
                        medium = load_video(path, num_frames=args.num_frames, sampling=processor.frame_sampling)
                except INPUT_ERRORS as error:
                    out.write(json.dumps({"path": path, "error": str(error)}) + "\n")
                    continue
                texts.append(processor.apply_chat_template(chat_messages(DEFAULT_PROMPTS[kind], *_counts(kind))))
                images.append([medium] if kind == "image" else [])
                videos.append([medium] if kind == "video" else [])
                chunk.append(path)
            if not chunk:
                continue
            batch = processor(texts, images=images, videos=videos).to(args.device)
            with torch.inference_mode():
                ids = target.generate(**batch, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
            for path, row in zip(chunk, ids[:, batch["input_ids"].shape[1] :], strict=True):
                ended = torch.isin(row, eos).nonzero()
                count = int(ended[0, 0]) + 1 if len(ended) else row.shape[0]
                caption = tokenizer.decode(row[:count], skip_special_tokens=True)
                out.write(
                    json.dumps({"path": path, "caption": caption, "new_tokens": count}, ensure_ascii=False) + "\n"
                )
                captioned, new_tokens = captioned + 1, new_tokens + count
    seconds = time.perf_counter() - started
    print(
        f"{captioned} of {len(paths)} inputs captioned in {seconds:.1f} s at batch size {args.batch_size}: "
        f"{captioned / seconds * 60:.1f} inputs/minute, {new_tokens / seconds:.1f} new tokens/s"
    )


def _counts(kind: str) -> tuple[int, int]:
    """(images, videos) of an input of `kind`."""
    return (1, 0) if kind == "image" else (0, 1)


if __name__ == "__main__":
    main()
