"""The demo pair's training batches: the same whatever builds them, with long clips where the share asks for them."""

from __future__ import annotations

import pytest
import torch

from vlmspec.eval.demo_pair import build_demo_processor, build_demo_tokenizer
from vlmspec.eval.synthetic import items
from vlmspec.eval.train_demo import TrainBatches, batch_loader, collate, is_long_video

#: Merged visual tokens of a demo clip (8 frames at 112 px) and of a long one (32 frames at 336 px, default budget).
SHORT_GRID, LONG_GRID = [4, 8, 8], [16, 24, 24]
SHORT_TOKENS, LONG_TOKENS = 64, 2304


@pytest.fixture(scope="module")
def processor():
    return build_demo_processor(build_demo_tokenizer())


def assert_same_batch(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_loader_processes_build_the_inline_batches(processor):
    # Items 0-7 alternate images and videos; with share 0.5 the videos of seeds 3 and 5 are long, 1 and 7 short.
    batches = TrainBatches(processor, steps=2, batch_size=4, long_video_share=0.5)
    inline = list(batch_loader(batches, workers=0))
    built = list(batch_loader(batches, workers=2))
    assert len(inline) == len(built) == 2
    for a, b in zip(inline, built, strict=True):
        assert_same_batch(a, b)


def test_a_long_video_share_gives_some_rows_the_long_clip(processor):
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    batch = TrainBatches(processor, steps=1, batch_size=4, long_video_share=0.5)[0]
    assert [is_long_video(seed, 0.5) for seed in (1, 3)] == [False, True]
    assert batch["video_grid_thw"].tolist() == [SHORT_GRID, LONG_GRID]
    assert (batch["input_ids"] == video_pad).sum(dim=1).tolist() == [0, SHORT_TOKENS, 0, LONG_TOKENS]
    # The long clip has the short one's scene, so the same caption is learnt from either.
    short = TrainBatches(processor, steps=1, batch_size=4)[0]
    assert short["video_grid_thw"].tolist() == [SHORT_GRID, SHORT_GRID]
    assert torch.equal(batch["labels"][3][batch["labels"][3] != -100], short["labels"][3][short["labels"][3] != -100])


def test_no_share_keeps_the_plain_batches(processor):
    assert_same_batch(
        TrainBatches(processor, steps=1, batch_size=4)[0], collate([(processor, item) for item in items("train", 4)])
    )
    assert not any(is_long_video(seed, 0.0) for seed in range(100))
    assert all(is_long_video(seed, 1.0) for seed in range(100))
