"""LLaVA-OneVision: 1-D RoPE; anyres image features (with image_newline tokens) and pooled video frames."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.functional import pad
from transformers.image_processing_utils import select_best_resolution
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

from .base import ModelAdapter, VideoProcessing, VisualLayout, items_per_row, split_runs


class LlavaOnevisionAdapter(ModelAdapter):
    model_classes = ("LlavaOnevisionForConditionalGeneration",)
    quantization_skip_modules = ("model.vision_tower", "model.multi_modal_projector", "lm_head")
    special_token_attributes = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")
    input_keys = (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "image_sizes",
        "pixel_values_videos",
        "image_sizes_videos",
        "batch_num_images",
    )
    video_processing = VideoProcessing(
        processor_classes=("LlavaOnevisionProcessor",),
        video_processor="LlavaOnevisionVideoProcessor",
        defaults=dict(size={"height": 384, "width": 384}, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD),
        packing="pooled-frames",
        sampling="uniform",
    )

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`(B, L)`: each row counts its own tokens from 0, after its left padding, as `generate` positions them."""
        mask = inputs.get("attention_mask")
        if mask is None:
            return torch.arange(inputs["input_ids"].shape[1], device=inputs["input_ids"].device)[None]
        return (mask.long().cumsum(-1) - 1).clamp_min(0)

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[None]

    def visual_layout(self, inputs: dict[str, Any]) -> VisualLayout:
        """One group per image (base view, crops and newlines); one per pooled video frame, the final newline last."""
        input_ids = inputs["input_ids"]
        mask = self.visual_token_mask(input_ids)
        vision = self.model.config.vision_config
        per_frame = math.ceil(vision.image_size // vision.patch_size / 2) ** 2
        video_id = self.model.config.video_token_id
        groups, group = [], 0
        for start, end in split_runs(mask):
            if int(input_ids[0, start]) == video_id:
                frames = max(1, (end - start - 1) // per_frame)
                groups.append(group + (torch.arange(end - start) // per_frame).clamp_max(frames - 1))
                group += frames
            else:
                groups.append(torch.full((end - start,), group))
                group += 1
        empty = torch.zeros(0, dtype=torch.long)
        return VisualLayout(mask, torch.cat(groups).to(input_ids.device) if groups else empty.to(input_ids.device))

    def split_visual(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """Images go to rows by the rows' image token counts (each image's count as the processor gives it), videos by
        their video token counts (frames * pooled tokens + a newline each).

        `pixel_values` `(N, P, C, H, W)` is zero-padded to the batch's most patches; a row's images keep as many
        patches as its own images' most, as the processor pads them for the row alone (the model reads only each
        image's own patches, counted from `image_sizes`). `batch_num_images` has one entry per image group (a prompt
        given as a nested list of images, or one image given flat); a group never spans rows.
        """
        input_ids, config = inputs["input_ids"], self.model.config
        rows: list[dict[str, Any]] = [{} for _ in range(input_ids.shape[0])]
        pixels = inputs.get("pixel_values")
        if pixels is not None:
            sizes, per_group = inputs["image_sizes"], inputs.get("batch_num_images")
            counts = torch.ones(len(sizes), dtype=torch.long) if per_group is None else per_group.cpu()
            group = torch.repeat_interleave(torch.arange(len(counts)), counts)
            patched = (counts[group] == 1).tolist()
            tokens = torch.tensor([self.image_tokens(s, p) for s, p in zip(sizes.tolist(), patched, strict=True)])
            patches = [
                image_size_to_num_patches(s, config.image_grid_pinpoints, config.vision_config.image_size) if p else 1
                for s, p in zip(sizes.tolist(), patched, strict=True)
            ]
            offsets = items_per_row(input_ids, config.image_token_id, tokens)
            for row, start, end in zip(rows, offsets[:-1], offsets[1:], strict=True):
                if start == end:
                    continue
                row["pixel_values"] = pixels[start:end, : max(patches[start:end])]
                row["image_sizes"] = sizes[start:end]
                if per_group is not None:
                    groups, sizes_in_row = torch.unique_consecutive(group[start:end], return_counts=True)
                    if not torch.equal(sizes_in_row, counts[groups]):
                        raise ValueError("batch_num_images groups images of different prompts together")
                    row["batch_num_images"] = per_group[groups.to(per_group.device)]
        videos = inputs.get("pixel_values_videos")
        if videos is not None:
            side = config.vision_config.image_size // config.vision_config.patch_size
            per_video = videos.shape[1] * math.ceil(side / 2) ** 2 + 1
            offsets = items_per_row(input_ids, config.video_token_id, torch.full((len(videos),), per_video))
            for row, start, end in zip(rows, offsets[:-1], offsets[1:], strict=True):
                if start == end:
                    continue
                row["pixel_values_videos"] = videos[start:end]
                if inputs.get("image_sizes_videos") is not None:
                    row["image_sizes_videos"] = inputs["image_sizes_videos"][start:end]
        return rows

    def image_tokens(self, size: list[int], patched: bool) -> int:
        """The image tokens `LlavaOnevisionProcessor` gives one image of `size` (height, width): with `patched`
        (anyres) the base view, the crops' features left after unpadding (pooled down to `anyres_max_N` crops) and
        a newline per feature row; otherwise one view and a newline."""
        config = self.model.config
        crop = config.vision_config.image_size
        side = crop // config.vision_config.patch_size
        tokens = side * side + 1
        if patched:
            height, width = size
            best_height, best_width = select_best_resolution([height, width], config.image_grid_pinpoints)
            rows, columns = side * (best_height // crop), side * (best_width // crop)
            if width / height > columns / rows:
                rows -= (rows - int(round(height * (columns / width), 7))) // 2 * 2
            else:
                columns -= (columns - int(round(width * (rows / height), 7))) // 2 * 2
            ratio = math.sqrt(rows * columns / (int(config.vision_aspect_ratio.removeprefix("anyres_max_")) * side**2))
            if ratio > 1.1:
                rows, columns = int(rows // ratio), int(columns // ratio)
            tokens = side * side + rows * (columns + 1)
        return tokens - (config.vision_feature_select_strategy == "default")

    @classmethod
    def join_visual(cls, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """As the processor collates: images' patches zero-padded to the batch's most; videos must have as many
        frames as each other (the processor stacks them)."""
        frames = {row["pixel_values_videos"].shape[1] for row in rows if row.get("pixel_values_videos") is not None}
        if len(frames) > 1:
            raise ValueError(f"videos of {sorted(frames)} frames cannot share a batch (the processor stacks them)")
        most = max((row["pixel_values"].shape[1] for row in rows if row.get("pixel_values") is not None), default=0)
        padded = [
            {
                **row,
                "pixel_values": pad(row["pixel_values"], (0, 0, 0, 0, 0, 0, 0, most - row["pixel_values"].shape[1])),
            }
            if row.get("pixel_values") is not None
            else row
            for row in rows
        ]
        return super().join_visual(padded)
