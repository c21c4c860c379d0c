"""`vlmspec.generate`: a prompt and media in, text out, with the model pair loaded once per process."""

from __future__ import annotations

import os
from typing import Any

import torch

from .demo_models import demo_pair
from .engine.relaxed import resolve_verification
from .engine.stats import SpecStats
from .processors import load_images, load_videos
from .processors.checks import check_context, check_count, check_frame_request, check_prompts
from .speculative import SpeculativeVLM

_PAIRS: dict[tuple, SpeculativeVLM] = {}


def load_pair(model: str | None = None, draft: str | None = None, **load_kwargs: Any) -> SpeculativeVLM:
    """The pair for `model`/`draft` (hub ids or paths), loaded on first use and cached for the process.

    With neither given, the bundled demo pair (shipped in bfloat16, computed in float32 unless `torch_dtype` says).
    """
    if model is None and draft is None:
        pair = demo_pair()
        if pair is None:
            raise ValueError(
                "no model given and the bundled demo pair is not installed: pass model=... and draft=... "
                "(hub ids or local directories of a supported VLM and its draft)"
            )
        model, draft = pair
        if load_kwargs.get("torch_dtype") is None:
            load_kwargs["torch_dtype"] = torch.float32
    if model is None or draft is None:
        raise ValueError(f"pass both model= and draft= (got model={model!r}, draft={draft!r})")
    key = (str(model), str(draft), tuple(sorted((k, repr(v)) for k, v in load_kwargs.items() if v is not None)))
    if key not in _PAIRS:
        _PAIRS[key] = SpeculativeVLM.from_pretrained(str(model), str(draft), **load_kwargs)
    return _PAIRS[key]


def default_device_map() -> dict[str, str] | None:
    """The whole pair on the first GPU when one is visible; None (the CPU) otherwise."""
    return {"": "cuda:0"} if torch.cuda.is_available() else None


def generate(
    prompt: str | list[str],
    images: Any = None,
    videos: Any = None,
    *,
    model: str | None = None,
    draft: str | None = None,
    max_new_tokens: int = 128,
    return_stats: bool = False,
    policy: Any = "auto",
    pruning: Any = "auto",
    prune_ratio: float | None = None,
    num_frames: int | None = None,
    fps: float | None = None,
    max_frames: int | None = None,
    start: float | None = None,
    end: float | None = None,
    torch_dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    target_quantization: Any = None,
    draft_quantization: Any = None,
    compile: str | bool = "auto",
    batch_size: int = 8,
    verification: Any = "exact",
    **options: Any,
) -> str | list[str] | tuple[str | list[str], SpecStats | list[SpecStats]]:
    """Describe images and videos with a target VLM, sped up by its draft; returns exactly the target's own text.

    Decoding follows the target's generation config: its greedy text, or, where the config samples, a draw from
    exactly its distribution (pass `do_sample=False` for greedy, `generator=` or `torch.manual_seed` to repeat).

    `images` and `videos` take paths, URLs, PIL images, arrays, tensors (and, for videos, lists of frames). Given a
    list of prompts, the media are shared by all of them, or given per prompt as a list of the same length; the
    result is then a list in the prompts' order. The prompts decode together, up to `batch_size` at once
    (`SpeculativeVLM.stream`), each exactly as it would alone (greedy: the same text). Every prompt's media are read
    before any decoding starts. Videos are sampled with `num_frames`, or `fps` capped by `max_frames`, between `start`
    and `end` seconds. Other keyword arguments go to `SpeculativeVLM.generate` (e.g. `min_new_tokens`, `temperature`).

    The pair goes where `device_map` says; by default onto the first GPU when one is visible, else the CPU.
    `compile` (`"auto"`, `"on"`/True, `"off"`/False) runs the decoding forwards compiled; `"auto"` on CUDA only.
    `verification="relaxed"` (or a `RelaxedVerification`) trades exactness for speed, greedy only: the text may then
    differ from the target's (the stats' `differing_tokens` count where; docs/policies.md).

    Arguments are checked before any model loads; bad ones and bad media raise the `VLMSpecError` of their kind,
    naming the argument or file.
    """
    frames = dict(num_frames=num_frames, fps=fps, max_frames=max_frames, start=start, end=end)
    prompts = _checked_prompts(prompt, max_new_tokens, batch_size, frames)
    resolve_verification(verification)
    placed = default_device_map() if device_map is None else device_map
    quantization = dict(target_quantization=target_quantization, draft_quantization=draft_quantization)
    spec = load_pair(model, draft, torch_dtype=torch_dtype, device_map=placed, compile=compile, **quantization)
    runner = spec.with_options(policy, pruning, prune_ratio, verification)
    inputs = _checked_inputs(runner, prompts, images, videos, frames, max_new_tokens)
    if isinstance(prompt, str):
        return _generate_one(runner, inputs[0], max_new_tokens, return_stats, options)
    return _generate_many(runner, inputs, batch_size, max_new_tokens, return_stats, options)


def _checked_prompts(
    prompt: str | list[str], max_new_tokens: int, batch_size: int, frames: dict[str, Any]
) -> list[str]:
    """The prompts as a list, once the prompts, counts and frame request are checked (before any model loads)."""
    prompts = check_prompts(prompt)
    check_count("max_new_tokens", max_new_tokens, optional=False)
    check_count("batch_size", batch_size, optional=False)
    check_frame_request(**frames)
    return prompts


def _checked_inputs(
    runner: SpeculativeVLM, prompts: list[str], images: Any, videos: Any, frames: dict[str, Any], max_new_tokens: int
) -> list[dict[str, Any]]:
    """Every prompt's model inputs, its media read and its length checked against the context, before any decoding
    starts (a bad medium or an overlong prompt fails the call before any prompt decodes)."""
    inputs = [
        _prompt_inputs(runner, text, _for_prompt(images, i, len(prompts)), _for_prompt(videos, i, len(prompts)), frames)
        for i, text in enumerate(prompts)
    ]
    for row in inputs:
        check_context(runner.context_length, row["input_ids"].shape[1], max_new_tokens)
    return inputs


def _generate_one(
    runner: SpeculativeVLM, inputs: dict[str, Any], max_new_tokens: int, return_stats: bool, options: dict[str, Any]
) -> str | tuple[str, SpecStats]:
    """A single prompt's text (and its stats with `return_stats`), from one `SpeculativeVLM.generate` call."""
    ids = runner.generate(**inputs, max_new_tokens=max_new_tokens, **options)
    text = _decoded(runner, ids, inputs)
    return (text, runner.last_stats) if return_stats else text


def _generate_many(
    runner: SpeculativeVLM,
    inputs: list[dict[str, Any]],
    batch_size: int,
    max_new_tokens: int,
    return_stats: bool,
    options: dict[str, Any],
) -> list[str] | tuple[list[str], list[SpecStats]]:
    """A list of prompts' texts in their order (and their stats with `return_stats`), decoded together by
    `SpeculativeVLM.stream`, up to `batch_size` at once; a prompt's error is raised as it comes."""
    results = {}
    for result in runner.stream(enumerate(inputs), batch_size, max_new_tokens=max_new_tokens, **options):
        if result.error is not None:
            raise result.error
        results[result.key] = result
    texts = [_decoded(runner, results[i].sequence, row) for i, row in enumerate(inputs)]
    stats = [results[i].stats for i in range(len(inputs))]
    return (texts, stats) if return_stats else texts


def _for_prompt(media: Any, index: int, count: int) -> Any:
    """This prompt's media: shared media, or its entry of a per-prompt list."""
    if count > 1 and isinstance(media, (list, tuple)) and len(media) == count:
        return media[index]
    return media


def _image_names(sources: Any, count: int) -> list[str]:
    """What to call each image in an error: its path or URL, else its place in `images`."""
    listed = sources if isinstance(sources, (list, tuple)) else [sources]
    return [str(s) if isinstance(s, (str, os.PathLike)) else f"images[{i}]" for i, s in enumerate(listed)][:count]


def _prompt_inputs(spec: SpeculativeVLM, prompt: str, images: Any, videos: Any, frames: dict) -> dict[str, Any]:
    """One prompt's model inputs, its media read (a bad medium raises its error, naming it)."""
    image_list = load_images(images)
    video_list = load_videos(videos, sampling=spec.processor.frame_sampling, **frames)
    names = _image_names(images, len(image_list)) + [
        v.source if v.source != "<frames>" else f"videos[{j}]" for j, v in enumerate(video_list)
    ]
    return dict(spec.processor.prompt_inputs(prompt, image_list, video_list, names))


def _decoded(spec: SpeculativeVLM, ids: torch.Tensor, inputs: dict[str, Any]) -> str:
    """The text of the new tokens of `ids` (1, L + n), after the prompt of `inputs`."""
    return spec.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
