"""`vlmspec.pipeline`: a drop-in for `transformers.pipeline("image-text-to-text")` that decodes speculatively.

It is `transformers`' own `ImageTextToTextPipeline` (same call forms: `images=`/`text=`, chat messages,
`max_new_tokens`, `return_full_text`; same output format) whose generation step runs `SpeculativeVLM.generate`,
plus video: chat content entries `{"type": "video", "video": path_or_frames}`. With `batch_size` above 1, a list or
stream of inputs is decoded with continuous batching (`SpeculativeVLM.stream`): up to `batch_size` prompts in flight,
the next preprocessed ahead on a background thread, outputs in input order, each exactly its batch-size-1 output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers import GenerationConfig, PreTrainedModel
from transformers import pipeline as hf_pipeline
from transformers.pipelines.image_text_to_text import Chat, ImageTextToTextPipeline

from ..processors import VisualInputs, load_image
from ..speculative import SpeculativeVLM

_MEDIA_KEYS = ("image", "video", "url", "path")
_GENERATION_SETTINGS = frozenset(GenerationConfig().to_dict()) - {"max_new_tokens", "transformers_version"}


class SpeculativeImageTextToTextPipeline(ImageTextToTextPipeline):
    """`ImageTextToTextPipeline` whose `generate` is a `SpeculativeVLM`'s, with video in chat messages."""

    def __init__(self, *args: Any, speculative: SpeculativeVLM, visual_inputs: VisualInputs, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.speculative = speculative
        self.visual_inputs = visual_inputs

    def _sanitize_parameters(self, generate_kwargs=None, **kwargs):
        """Generation settings given to the call (`do_sample=False`, `temperature`, ...) go to generate, not the
        processor, which would drop them."""
        generation = {k: kwargs.pop(k) for k in list(kwargs) if k in _GENERATION_SETTINGS}
        if generation:
            generate_kwargs = {**(generate_kwargs or {}), **generation}
        return super()._sanitize_parameters(generate_kwargs=generate_kwargs, **kwargs)

    def preprocess(self, inputs=None, timeout=None, continue_final_message=None, **processing_kwargs):
        if isinstance(inputs, Chat) and _has_video(inputs.messages):
            messages, images, videos = _split_media(inputs.messages)
            final_is_assistant = inputs.messages[-1]["role"] == "assistant"
            continue_final = final_is_assistant if continue_final_message is None else continue_final_message
            text = self.processor.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=not continue_final,
                continue_final_message=continue_final,
            )
            model_inputs = self.visual_inputs(text, images=images, videos=videos).to(dtype=self.dtype)
            model_inputs["text"] = inputs
            return model_inputs
        return super().preprocess(
            inputs, timeout=timeout, continue_final_message=continue_final_message, **processing_kwargs
        )

    def get_iterator(
        self, inputs, num_workers: int, batch_size: int, preprocess_params, forward_params, postprocess_params
    ):
        """Lists and streams of inputs: one at a time as `transformers` runs them for `batch_size` 1, else through
        continuous batching."""
        if batch_size == 1:
            return super().get_iterator(
                inputs, num_workers, batch_size, preprocess_params, forward_params, postprocess_params
            )
        return self._batched(inputs, batch_size, preprocess_params, forward_params, postprocess_params)

    def _batched(
        self, inputs: Iterable, batch_size: int, preprocess_params, forward_params, postprocess_params
    ) -> Iterator[Any]:
        """Each input's output in input order, up to `batch_size` decoding at once; inputs are preprocessed (media
        decoded) on a background thread, up to `batch_size` + 2 ahead."""
        kwargs = forward_params.get("generate_kwargs") or {}
        kwargs = self._prepare_generate_kwargs(kwargs, return_dict_in_generate=False)
        prompts: dict[int, tuple[Any, Any]] = {}

        def prepared() -> Iterator[tuple[int, dict[str, Any]]]:
            with ThreadPoolExecutor(max_workers=1) as pool:
                ahead: deque = deque()
                source = iter(enumerate(inputs))
                for index, item in source:
                    ahead.append((index, pool.submit(self.preprocess, item, **preprocess_params)))
                    if len(ahead) < batch_size + 2:
                        continue
                    yield self._prompt(*ahead.popleft(), prompts)
                while ahead:
                    yield self._prompt(*ahead.popleft(), prompts)

        done: dict[int, Any] = {}
        next_index = 0
        for result in self.speculative.stream(prepared(), batch_size, **kwargs):
            if result.error is not None:
                raise result.error
            done[result.key] = result.sequence
            while next_index in done:
                text, input_ids = prompts.pop(next_index)
                output = {"generated_sequence": done.pop(next_index), "prompt_text": text, "input_ids": input_ids}
                yield self.postprocess(output, **postprocess_params)
                next_index += 1

    @staticmethod
    def _prompt(index: int, future: Any, prompts: dict[int, tuple[Any, Any]]) -> tuple[int, dict[str, Any]]:
        """A preprocessed input as the scheduler takes it; its text and ids kept for the output."""
        model_inputs = future.result()
        prompts[index] = (model_inputs.pop("text"), model_inputs["input_ids"])
        return index, dict(model_inputs)

    def _forward(self, model_inputs, generate_kwargs=None):
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs or {}, return_dict_in_generate=False)
        prompt_text = model_inputs.pop("text")
        input_ids = model_inputs["input_ids"]
        generated = self.speculative.generate(**model_inputs, **generate_kwargs)
        return {"generated_sequence": generated, "prompt_text": prompt_text, "input_ids": input_ids}


def _has_video(messages: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(c.get("type") == "video" for c in m["content"]) for m in messages
    )


def _split_media(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list, list]:
    """Messages with bare `{"type": ...}` media entries, and the images and videos they held, in order."""
    images, videos, stripped = [], [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            stripped.append(message)
            continue
        entries = []
        for entry in content:
            kind = entry.get("type")
            if kind in ("image", "video"):
                source = next((entry[k] for k in _MEDIA_KEYS if k in entry), None)
                (images if kind == "image" else videos).append(load_image(source) if kind == "image" else source)
                entries.append({"type": kind})
            else:
                entries.append(entry)
        stripped.append({**message, "content": entries})
    return stripped, images, videos


def pipeline(
    task: str = "image-text-to-text",
    model: str | PreTrainedModel | None = None,
    draft_model: str | PreTrainedModel | None = None,
    *,
    processor: Any = None,
    policy: Any = "auto",
    pruning: Any = "auto",
    prune_ratio: float | None = None,
    torch_dtype: Any = None,
    device_map: Any = None,
    **kwargs: Any,
) -> SpeculativeImageTextToTextPipeline:
    """Like `transformers.pipeline(task, model=...)`, with `draft_model` drafting for `model`.

    `model`/`draft_model` are hub ids, directories or loaded models (then pass `processor`, the target's own or a
    `VisualInputs`). Other keyword arguments go to the pipeline as with `transformers.pipeline`.
    """
    if task != "image-text-to-text":
        raise ValueError(f"vlmspec.pipeline serves the 'image-text-to-text' task, not {task!r}")
    if model is None or draft_model is None:
        raise ValueError("pass both model= and draft_model=")
    if isinstance(model, str):
        from ..api import load_pair

        if not isinstance(draft_model, str):
            raise ValueError("give model and draft_model both as names or paths, or both as loaded models")
        loaded = load_pair(model, draft_model, torch_dtype=torch_dtype, device_map=device_map)
        target, draft, visual_inputs = loaded.target, loaded.draft, loaded.processor
    else:
        if processor is None:
            raise ValueError("with loaded models, pass processor= (the target's processor)")
        target, draft = model, draft_model
        visual_inputs = processor if isinstance(processor, VisualInputs) else VisualInputs(processor)
    speculative = SpeculativeVLM(
        target,
        draft,
        policy,
        pruning=pruning,
        prune_ratio=prune_ratio,
        vocab_size=len(visual_inputs.tokenizer),
        processor=visual_inputs,
    )
    return hf_pipeline(
        task,
        model=target,
        processor=visual_inputs.processor,
        pipeline_class=SpeculativeImageTextToTextPipeline,
        speculative=speculative,
        visual_inputs=visual_inputs,
        **kwargs,
    )
