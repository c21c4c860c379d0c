"""The contract between the model-agnostic engine and one model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.nn.functional import pad
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

#: The target's features of a prompt's tokens `(B, L, 3H)`, which a draft head's prompt pass reads.
FEATURE_KEY = "target_features"
#: Inputs with one vector per prompt token, `(B, L, hidden)`, left-padded in a batch as the token inputs are.
EMBEDDING_KEYS = ("inputs_embeds", FEATURE_KEY)


@dataclass
class Prefill:
    """What a prefill leaves behind: logits of the last prompt token, tokens cached, position of the next token."""

    last_logits: torch.Tensor
    length: int
    next_position: int


@dataclass
class VisualLayout:
    """Where a prompt's visual tokens are: a mask over the prompt and each visual token's group.

    A group is one image or one video frame (temporal patch); tokens of a group are in raster order, so evenly
    spaced picks within a group are spread over the picture.
    """

    mask: torch.Tensor
    groups: torch.Tensor

    @property
    def positions(self) -> torch.Tensor:
        """Prompt indices of the visual tokens."""
        return self.mask.nonzero().squeeze(1)


@dataclass(frozen=True)
class VideoProcessing:
    """How a family's processor turns frames into video inputs, as `transformers` 5.23's video processor class for
    it does, so vlmspec can do the same without torchvision.

    `processor_classes` are the processor classes that load the video processor class `video_processor`, whose
    defaults are `defaults` (a checkpoint's config states only what differs). `packing` names the packer:
    `"patches"` (Qwen-style spatio-temporal patches; `timestamps` adds per-frame time blocks) or
    `"pooled-frames"` (frames resized to the vision tower's input and pooled, with a newline token); `sampling`
    the frame rule: `"qwen"` (qwen-vl-utils' frame rate and bounds) or `"uniform"` (transformers' own sampler).
    `pixel_bounds` reads the legacy `min_pixels`/`max_pixels` keys into `size`; `whole_temporal_patch` says the video
    processor takes no clip shorter than its temporal patch (vlmspec repeats a short clip's last frame).
    """

    processor_classes: tuple[str, ...]
    video_processor: str
    defaults: dict[str, Any]
    packing: str = "patches"
    sampling: str = "qwen"
    timestamps: bool = False
    pixel_bounds: bool = False
    whole_temporal_patch: bool = False


class ModelAdapter(ABC):
    """Family-specific knowledge: prompt positions, visual token layout, pruned prefill, positioned decoding."""

    #: Names of the model classes this adapter serves (matched against the model's class and its bases).
    model_classes: ClassVar[tuple[str, ...]] = ()
    #: The keyword inputs of the family's processor that go to the model (the rest are generation arguments).
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    #: Inputs that only shape positions and never reach the model's forward.
    position_only_keys: ClassVar[tuple[str, ...]] = ()
    #: Modules that `"8bit"`/`"4bit"` presets leave unquantised (vision tower, projector, output head).
    quantization_skip_modules: ClassVar[tuple[str, ...]] = ("lm_head",)
    #: Inputs that carry video (a prompt with any of them is pruned at the video ratio).
    video_input_keys: ClassVar[tuple[str, ...]] = ("pixel_values_videos",)
    #: Config attributes (of the model's or its text config) naming the multimodal special tokens, which a target
    #: and its draft must share.
    special_token_attributes: ClassVar[tuple[str, ...]] = ("image_token_id", "video_token_id")
    #: How the family's processor packs video (None: vlmspec cannot pack video for it without torchvision).
    video_processing: ClassVar[VideoProcessing | None] = None
    #: Inputs with one entry per prompt token, `(B, L)` and left-padded in a batch (the rest are visual inputs).
    token_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")

    def __init__(self, model: PreTrainedModel):
        self.model = model

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def language_model(self) -> torch.nn.Module:
        return self.model.model.language_model

    def attention_modules(self) -> list[torch.nn.Module]:
        """The self-attention module of every decoder layer, in order."""
        return [layer.self_attn for layer in self.language_model.layers]

    def has_video(self, inputs: dict[str, Any]) -> bool:
        """Whether the prompt's inputs hold a video."""
        return any(inputs.get(key) is not None for key in self.video_input_keys)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def layer_devices(self) -> list[torch.device]:
        """The device of every decoder layer's attention, in order (layers may sit on different GPUs)."""
        return [next(module.parameters()).device for module in self.attention_modules()]

    def split_rows(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """Each prompt's inputs, batch size 1, exactly as the processor returns them for that prompt alone, from its
        left-padded batch for a list of prompts (`input_ids` `(B, L)`, `attention_mask` and the visual inputs).

        The padding is cut from the token inputs; each row gets only its own images and videos (`split_visual`).
        """
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(inputs["input_ids"])
        starts = (mask.cumsum(1) == 0).sum(1)
        if int(mask.sum()) != int((mask.shape[1] - starts).sum()):
            raise ValueError("the batch is not left-padded: its attention mask has zeros after a prompt's start")
        keys = [k for k in (*self.token_keys, *EMBEDDING_KEYS) if inputs.get(k) is not None]
        tokens = [{k: inputs[k][row : row + 1, start:] for k in keys} for row, start in enumerate(starts.tolist())]
        return [{**row, **visual} for row, visual in zip(tokens, self.split_visual(inputs), strict=True)]

    def split_visual(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """Per row of the batch, its own visual inputs (none for a batch without any); families with visual inputs
        override it."""
        visual = [k for k, v in inputs.items() if k not in (*self.token_keys, *EMBEDDING_KEYS) and v is not None]
        if visual:
            raise NotImplementedError(f"{type(self).__name__} cannot split the visual inputs {visual} into rows")
        return [{} for _ in range(inputs["input_ids"].shape[0])]

    @classmethod
    def join_rows(cls, rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
        """The left-padded batch the processor returns for a list of prompts, from each prompt's own inputs (the
        inverse of `split_rows`; it needs no model): token inputs padded on the left (`input_ids` with
        `pad_token_id`, the rest with 0), visual inputs collated by `join_visual`."""
        length = max(row["input_ids"].shape[1] for row in rows)
        per_token = (*cls.token_keys, *EMBEDDING_KEYS)
        batch = {}
        for key in per_token:
            present = [row[key] for row in rows if row.get(key) is not None]
            if not present:
                continue
            if len(present) != len(rows):
                raise ValueError(f"{key} is given for some rows only")
            fill = pad_token_id if key == "input_ids" else 0
            # The tokens' dimension is the second; embeddings carry one more after it.
            padding = [(0, 0) * (t.ndim - 2) + (length - t.shape[1], 0) for t in present]
            batch[key] = torch.cat([pad(t, p, value=fill) for t, p in zip(present, padding, strict=True)])
        batch.update(cls.join_visual([{k: v for k, v in row.items() if k not in per_token} for row in rows]))
        return batch

    @classmethod
    def join_visual(cls, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch's visual inputs from each row's: every tensor concatenated over the rows that have it (the
        processor's layout for inputs with one entry per image, video or patch)."""
        keys = dict.fromkeys(k for row in rows for k, v in row.items() if v is not None)
        return {k: torch.cat([row[k] for row in rows if row.get(k) is not None]) for k in keys}

    @abstractmethod
    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The prompt's `position_ids` exactly as `generate` builds them."""

    @abstractmethod
    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        """The model's `position_ids` for text tokens at 1-D `positions` (q,)."""

    @abstractmethod
    def visual_layout(self, inputs: dict[str, Any]) -> VisualLayout:
        """Which prompt tokens are visual and to which image or frame each belongs."""

    def visual_token_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        config = self.model.config
        ids = [
            i
            for i in (getattr(config, "image_token_id", None), getattr(config, "video_token_id", None))
            if i is not None
        ]
        return torch.isin(input_ids[0], torch.tensor(ids, device=input_ids.device))

    def prune_language_model_inputs(self, kwargs: dict[str, Any], keep: torch.Tensor) -> dict[str, Any]:
        """Cut the language model's prompt inputs down to each row's kept tokens (`keep` (B, L) bool), in order and
        at their original positions, the rows left-padded again to the most any row keeps."""
        index, real = kept_index(keep)
        embeds = kwargs["inputs_embeds"]
        kwargs["inputs_embeds"] = embeds.gather(1, index[..., None].expand(-1, -1, embeds.shape[-1]))
        positions = kwargs["position_ids"]
        kwargs["position_ids"] = positions.gather(-1, index.expand(*positions.shape[:-2], -1, -1))
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            kwargs["attention_mask"] = real.to(mask.dtype)
        return kwargs

    @contextmanager
    def pruned(self, keep: torch.Tensor | None):
        """While active, the language model sees only the kept prompt tokens (`keep` (B, L) bool), each at its
        original position.

        The model still encodes every image and frame and places the features as it always does; the cut happens
        at the language model's entrance, so anyres packing, newline tokens and deepstack features need no copy here.
        """
        if keep is None:
            yield
            return

        def cut(module, args, kwargs):
            return args, self.prune_language_model_inputs(kwargs, keep)

        handle = self.language_model.register_forward_pre_hook(cut, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def model_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """What a prompt pass feeds the model of a prompt's `inputs`: the family's inputs but those that only shape
        positions, with the caller's `inputs_embeds` (the target's, given to `generate`) in place of the ids."""
        model_inputs = {
            k: inputs[k] for k in self.input_keys if k not in self.position_only_keys and inputs.get(k) is not None
        }
        if inputs.get("inputs_embeds") is not None:
            model_inputs["inputs_embeds"] = inputs["inputs_embeds"]
            del model_inputs["input_ids"]
        return model_inputs

    def prefill(self, inputs: dict[str, Any], cache: Cache, keep: torch.Tensor | None = None) -> Prefill:
        """Run the prompt into `cache`; with `keep` (bool over the prompt) only those tokens enter the cache."""
        positions = self.prompt_positions(inputs)
        model_inputs = self.model_inputs(inputs)
        with self.pruned(None if keep is None else keep[None]):
            out = self.model(**model_inputs, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        length = inputs["input_ids"].shape[1] if keep is None else int(keep.sum())
        # Generation goes on from the last prompt token's position, not the largest: text after a long video sits
        # below the video's last temporal positions (its positions advance by the frame grid, not the clip length).
        return Prefill(last_logits=out.logits[0, -1], length=length, next_position=int(positions[..., -1].max()) + 1)

    def prefill_rows(
        self, inputs: dict[str, Any], cache: Cache, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[int]]:
        """Run a left-padded batch of prompts into `cache` in one forward; returns each row's last-token logits
        `(B, V)` and the position of each row's next token. With `keep` (B, L) bool (False on padding) only those
        tokens enter the cache, each row's left-padded again to the most any row keeps."""
        positions = self.prompt_positions(inputs)
        model_inputs = self.model_inputs(inputs)
        with self.pruned(keep):
            out = self.model(**model_inputs, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        rows = inputs["input_ids"].shape[0]
        return out.logits[:, -1], [int(positions[..., b, -1].max()) + 1 for b in range(rows)]

    def continue_prompt(self, input_ids: torch.Tensor, cache: Cache, next_position: int) -> torch.Tensor:
        """The last logits `(V,)` of text `input_ids` (1, q) fed after what `cache` (a transformers cache) holds, at
        positions from `next_position` on: how `generate` runs the uncached part of its inputs when it goes on from a
        cache (a continuation carries no new visual inputs)."""
        positions = torch.arange(next_position, next_position + input_ids.shape[1], device=input_ids.device)
        position_ids = self.position_ids(positions)
        out = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def position_offset(self, row: int) -> int:
        """How far past its index the next token of row `row` of a cache `generate` returned sits: 0, tokens
        positioned by their count (families whose positions depend on the last call's prompt override it)."""
        return 0

    def decode(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        bias: torch.Tensor,
        cache: Cache,
        model: Callable | None = None,
    ) -> torch.Tensor:
        """Logits `(q, V)` for `input_ids` (q,) at `positions`, attending through the additive mask `bias`; `model`
        runs the forward in the model's place (its compiled form)."""
        out = (self.model if model is None else model)(
            input_ids=input_ids[None],
            position_ids=self.position_ids(positions),
            attention_mask=bias,
            cache=cache,
            use_cache=True,
        )
        return out.logits[0]


def kept_index(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For `keep` (B, L) bool: `index` (B, W) of each row's kept tokens in order, left-padded (with indices of
    dropped ones) to W, the most any row keeps, and `real` (B, W) marking the kept ones."""
    counts = keep.sum(1)
    width = int(counts.max())
    index = torch.argsort(keep.to(torch.uint8), dim=1, stable=True)[:, keep.shape[1] - width :]
    real = torch.arange(width, device=keep.device) >= (width - counts)[:, None]
    return index, real


def split_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each run of True in a 1-D mask."""
    padded = torch.cat([mask.new_zeros(1), mask.to(torch.int8), mask.new_zeros(1)])
    edges = padded.diff().nonzero().squeeze(1).tolist()
    return list(zip(edges[0::2], edges[1::2], strict=True))


def items_per_row(input_ids: torch.Tensor, token_id: int, item_tokens: torch.Tensor) -> list[int]:
    """Where each row's visual items start and end: `(B + 1,)` offsets into the batch's items (images or videos, in
    row order) such that row r holds items `offsets[r]:offsets[r + 1]`, from the rows' counts of `token_id` in
    `input_ids` `(B, L)` and each item's token count `item_tokens` `(N,)`."""
    ends = torch.cat([item_tokens.new_zeros(1), item_tokens.cumsum(0)]).to(input_ids.device)
    row_ends = (input_ids == token_id).sum(1).cumsum(0)
    offsets = torch.cat([row_ends.new_zeros(1), torch.searchsorted(ends, row_ends, right=True) - 1])
    if not torch.equal(ends[offsets[1:]], row_ends) or int(offsets[-1]) != len(item_tokens):
        raise ValueError(
            f"the rows' {row_ends.diff(prepend=row_ends.new_zeros(1)).tolist()} tokens of id {token_id} are not whole "
            f"items of {item_tokens.tolist()} tokens each"
        )
    return offsets.tolist()
