"""`vlmspec demo`: caption the bundled sample image and video with the demo pair, against plain `generate`."""

from __future__ import annotations

import time

import torch

from ..api import load_pair
from ..demo_models import DEMO_DIR, demo_head, demo_pair
from ..processors import chat_messages, load_image, load_video
from .synthetic import IMAGE_PROMPT, VIDEO_PROMPT


def run_demo(max_new_tokens: int = 200, policy: str = "auto", draft: str | None = None, head: bool = False) -> None:
    """Print each sample's caption, whether it equals plain greedy output, tau and the speedup. `draft` (a VLM draft's
    or a draft head's folder or hub id), or with `head` the bundled demo head, drafts for the demo target in place
    of the bundled demo draft."""
    pair = demo_pair()
    if pair is None:
        raise SystemExit(
            f"the demo pair is not installed in {DEMO_DIR}; train it with `python -m vlmspec.eval.train_demo`"
        )
    if head:
        draft = demo_head()
        if draft is None:
            raise SystemExit(f"the demo head is not installed in {DEMO_DIR / 'head'}")
    spec = load_pair(*(() if draft is None else (pair[0], draft)), torch_dtype=torch.float32)
    print(f"target {pair[0]}, draft {pair[1] if draft is None else draft}")
    processor = spec.processor
    runner = spec.with_options(policy)
    samples = DEMO_DIR / "samples"
    cases = [
        ("image", samples / "sample.png", IMAGE_PROMPT, {"images": [load_image(samples / "sample.png")]}),
        ("video", samples / "sample.mp4", VIDEO_PROMPT, {"videos": [load_video(samples / "sample.mp4")]}),
    ]
    for kind, path, prompt, media in cases:
        messages = chat_messages(prompt, len(media.get("images", [])), len(media.get("videos", [])))
        inputs = processor(processor.apply_chat_template(messages), **media)
        length = inputs["input_ids"].shape[1]
        spec.target.generate(**inputs, do_sample=False, max_new_tokens=8)
        runner.generate(**inputs, max_new_tokens=8)
        start = time.perf_counter()
        reference = spec.target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        ar_seconds = time.perf_counter() - start
        start = time.perf_counter()
        ids = runner.generate(**inputs, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - start
        stats = runner.last_stats
        caption = processor.tokenizer.decode(ids[0, length:], skip_special_tokens=True)
        print(f"\n{kind}: {path}\n  {caption}")
        print(
            f"  identical to plain generate: {torch.equal(ids, reference)}  new tokens: {stats.new_tokens}  "
            f"tau: {stats.mean_accept_length:.2f}  speedup vs generate: {ar_seconds / seconds:.2f}x "
            f"({policy}, draft prefill {stats.draft_prefill_tokens} of {stats.target_prefill_tokens} tokens)"
        )
