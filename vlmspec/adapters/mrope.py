"""The Qwen-VL families' shared rules: 3-D M-RoPE prompt positions and grid-shaped visual tokens."""

from __future__ import annotations

from typing import Any

import torch

from .base import ModelAdapter, VisualLayout, items_per_row, split_runs

#: The Qwen-VL video processors' shared defaults (transformers 5.23).
QWEN_VIDEO_DEFAULTS: dict[str, Any] = dict(
    temporal_patch_size=2, merge_size=2, min_frames=4, max_frames=768, cap_pixels_per_frame=None
)


class MRopeAdapter(ModelAdapter):
    """Positions as `generate` builds them (`get_rope_index` when `mm_token_type_ids` is given); text after the
    prompt advances all three axes together."""

    position_only_keys = ("mm_token_type_ids",)
    token_keys = ("input_ids", "attention_mask", "mm_token_type_ids")
    #: Per kind of visual item: the config attribute of its token id, its grid key `(N, 3)`, its pixel key (rows of
    #: patches, t * h * w per item, concatenated) and its other keys with one entry per item.
    visual_items: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
        ("image_token_id", "image_grid_thw", "pixel_values", ()),
        ("video_token_id", "video_grid_thw", "pixel_values_videos", ("second_per_grid_ts",)),
    )
    special_token_attributes = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    #: Extra inputs `get_rope_index` reads besides ids, token types, grids and mask (e.g. seconds per grid).
    rope_index_keys: tuple[str, ...] = ()

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`(3, B, L)`: 3-D for visual prompts given `mm_token_type_ids`, else 1-D on all axes."""
        input_ids = inputs["input_ids"]
        has_visual = inputs.get("image_grid_thw") is not None or inputs.get("video_grid_thw") is not None
        if inputs.get("mm_token_type_ids") is not None and has_visual:
            positions, _ = self.model.model.get_rope_index(
                input_ids,
                inputs["mm_token_type_ids"],
                image_grid_thw=inputs.get("image_grid_thw"),
                video_grid_thw=inputs.get("video_grid_thw"),
                attention_mask=inputs.get("attention_mask"),
                **{k: inputs[k] for k in self.rope_index_keys if inputs.get(k) is not None},
            )
            return positions
        mask = inputs.get("attention_mask")
        if mask is None:
            return torch.arange(input_ids.shape[1], device=input_ids.device).view(1, 1, -1).expand(3, 1, -1)
        # Text alone: each row counts its own tokens from 0, after its left padding, on all three axes.
        return (mask.long().cumsum(-1) - 1).clamp_min(0)[None].expand(3, -1, -1)

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions.view(1, 1, -1).expand(3, 1, -1)

    def position_offset(self, row: int) -> int:
        """What `generate` adds to a row's index when it goes on from a cache: the rope deltas its last prompt left on
        the model (`generate` keeps them there between calls), none when no call left any."""
        deltas = getattr(self.model.model, "rope_deltas", None)
        if deltas is None:
            return 0
        deltas = deltas.reshape(-1)
        return int(deltas[row % deltas.numel()])

    def split_visual(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """Images and videos go to rows by the rows' visual token counts: an item of grid (t, h, w) has
        t * h * w / merge**2 tokens and t * h * w rows of patches."""
        rows: list[dict[str, Any]] = [{} for _ in range(inputs["input_ids"].shape[0])]
        merge = self.model.config.vision_config.spatial_merge_size**2
        for token_attribute, grid_key, pixel_key, item_keys in self.visual_items:
            grids = inputs.get(grid_key)
            if grids is None:
                continue
            patches = grids.prod(1)
            token_id = getattr(self.model.config, token_attribute)
            offsets = items_per_row(inputs["input_ids"], token_id, patches // merge)
            patch_offsets = [0, *patches.cumsum(0).tolist()]
            for row, start, end in zip(rows, offsets[:-1], offsets[1:], strict=True):
                if start == end:
                    continue
                row[pixel_key] = inputs[pixel_key][patch_offsets[start] : patch_offsets[end]]
                row[grid_key] = grids[start:end]
                row.update({k: inputs[k][start:end] for k in item_keys if inputs.get(k) is not None})
        return rows

    def visual_layout(self, inputs: dict[str, Any]) -> VisualLayout:
        """One group per image; one per temporal patch of a video, sized from `video_grid_thw`."""
        input_ids = inputs["input_ids"]
        mask = self.visual_token_mask(input_ids)
        merge = self.model.config.vision_config.spatial_merge_size**2
        video_grids = inputs.get("video_grid_thw")
        frame_sizes = [] if video_grids is None else [(int(t), int(h * w) // merge) for t, h, w in video_grids.tolist()]
        video_id = self.model.config.video_token_id
        groups, group, video, video_left = [], 0, 0, None
        for start, end in split_runs(mask):
            if int(input_ids[0, start]) != video_id:
                groups.append(torch.full((end - start,), group))
                group += 1
                continue
            if video_left is None:
                video_left = frame_sizes[video][0] * frame_sizes[video][1]
            per_frame = frame_sizes[video][1]
            groups.append(group + torch.arange(end - start) // per_frame)
            group += (end - start + per_frame - 1) // per_frame
            video_left -= end - start
            if video_left <= 0:
                video, video_left = video + 1, None
        empty = torch.zeros(0, dtype=torch.long)
        return VisualLayout(mask, torch.cat(groups).to(input_ids.device) if groups else empty.to(input_ids.device))
