"""Every entry point on every replica of the README's released pairs, given only the pair and a prompt with media.

Qwen2.5-VL's released generation config samples with top_k=1 and LLaVA-OneVision's is greedy: both are
deterministic, so every entry point returns what the target's own `generate` returns under its own config.
Qwen3-VL's (dense and MoE) samples at temperature 0.7 from top_k=20/top_p=0.8: every entry point samples from it
with no extra argument, the same seed (`torch.manual_seed`, or `--seed` on the command line) gives the same text, and
with `do_sample=False` every entry point returns what the target's own greedy `generate` returns.
"""

from __future__ import annotations

import json
from functools import cache

import pytest
import torch
import transformers
from conftest import DEVICE, device_flags, device_map, on_device

import vlmspec
from vlmspec import HeteroSpecConfig, PathEntropyBins, SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.cli import main
from vlmspec.processors import load_image, load_processor
from vlmspec.testing import REPLICA_PAIRS, chat_inputs, sample_frames, sample_image

PROMPT = "Describe the image in detail."  # also `vlmspec caption`'s default prompt for images
NEW_TOKENS = 8
FAMILIES = list(REPLICA_PAIRS)
SAMPLING = ["qwen3_vl", "qwen3_vl_moe"]
PLACEHOLDERS = {"llava_onevision": "<image>\n"}
QWEN_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def greedy_override(family: str) -> dict[str, bool]:
    """What a user of a sampling pair passes for greedy text: do_sample=False (nothing for the deterministic pairs)."""
    return {"do_sample": False} if family in SAMPLING else {}


@pytest.fixture(scope="module")
def image_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("media") / "image.png"
    sample_image(5, (48, 64)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(replica_pairs, image_path):
    """The target's own `generate` on the prompt and image, under its generation config (plus the greedy
    override for sampling pairs): new token ids and their text, per family, computed once."""

    @cache
    def compute(family: str) -> tuple[torch.Tensor, str]:
        spec = load_pair(*replica_pairs[family], device_map=device_map())
        inputs = on_device(chat_inputs(spec.processor, PROMPT, images=[load_image(image_path)]))
        ids = spec.target.generate(**inputs, max_new_tokens=NEW_TOKENS, **greedy_override(family))
        new = ids[0, inputs["input_ids"].shape[1] :]
        return new, spec.processor.tokenizer.decode(new, skip_special_tokens=True)

    return compute


@pytest.mark.parametrize("family", FAMILIES)
def test_vlmspec_generate_returns_the_targets_own_text(replica_pairs, image_path, reference, family):
    target, draft = replica_pairs[family]
    text = vlmspec.generate(
        PROMPT,
        images=image_path,
        model=target,
        draft=draft,
        max_new_tokens=NEW_TOKENS,
        device_map=device_map(),
        **greedy_override(family),
    )
    assert text == reference(family)[1]


@pytest.mark.parametrize("family", SAMPLING)
def test_vlmspec_generate_samples_the_released_config_the_same_for_the_same_seed(
    replica_pairs, image_path, reference, family
):
    target, draft = replica_pairs[family]

    def sample(seed: int) -> str:
        torch.manual_seed(seed)
        return vlmspec.generate(
            PROMPT, images=image_path, model=target, draft=draft, max_new_tokens=NEW_TOKENS, device_map=device_map()
        )

    text = sample(0)
    assert text != reference(family)[1]
    assert sample(0) == text


@pytest.fixture(scope="module")
def from_pretrained(replica_pairs):
    """`SpeculativeVLM.from_pretrained(target_dir, draft_dir)` per family, loaded once."""
    return cache(lambda family: SpeculativeVLM.from_pretrained(*replica_pairs[family], device_map=device_map()))


@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_generate_equals_the_targets_generate(from_pretrained, image_path, reference, family):
    spec = from_pretrained(family)
    inputs = chat_inputs(spec.processor, PROMPT, images=[load_image(image_path)])
    ids = spec.generate(**inputs, max_new_tokens=NEW_TOKENS, **greedy_override(family))
    assert torch.equal(ids[0, inputs["input_ids"].shape[1] :], reference(family)[0])


@pytest.mark.parametrize("policy", ["heterospec", "confidence"])
@pytest.mark.parametrize("family", FAMILIES)
def test_heterospec_and_confidence_decode_the_released_config_as_the_target(
    from_pretrained, image_path, reference, family, policy
):
    chosen = HeteroSpecConfig(bins=PathEntropyBins(edges=[0.5, 1.5, 3.0])) if policy == "heterospec" else policy
    spec = from_pretrained(family).with_options(chosen)
    inputs = chat_inputs(spec.processor, PROMPT, images=[load_image(image_path)])
    ids = spec.generate(**inputs, max_new_tokens=NEW_TOKENS, **greedy_override(family))
    assert torch.equal(ids[0, inputs["input_ids"].shape[1] :], reference(family)[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_decodes_as_the_targets_batched_generate(from_pretrained, image_path, family):
    """Two prompts of different lengths, one with the image, under the released generation config: the batch the
    processor makes for the list decodes as the target's own `generate` decodes that batch."""
    spec = from_pretrained(family)
    texts = [
        spec.processor.apply_chat_template(vlmspec.processors.chat_messages(PROMPT, 1, 0)),
        spec.processor.apply_chat_template(vlmspec.processors.chat_messages("Write a short poem about the sea.", 0, 0)),
    ]
    batch = on_device(dict(spec.processor(texts, images=[[load_image(image_path)], []])))
    assert bool((batch["attention_mask"] == 0).any())
    kwargs = dict(max_new_tokens=NEW_TOKENS, **greedy_override(family))
    assert torch.equal(spec.generate(**batch, **kwargs), spec.target.generate(**batch, **kwargs))


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_strings_a_custom_processor_and_scores_decode_a_batch_as_the_targets_generate(
    from_pretrained, image_path, reference, family
):
    """Under the released config, a padded batch with a stop string the first row reaches, a caller's processor and
    `output_scores`: the target's own `generate` on that batch, ids and scores."""
    from test_custom_processors import AlternatingParity

    spec = from_pretrained(family)
    tokenizer = spec.processor.tokenizer
    texts = [
        spec.processor.apply_chat_template(vlmspec.processors.chat_messages(PROMPT, 1, 0)),
        spec.processor.apply_chat_template(vlmspec.processors.chat_messages("Write a short poem about the sea.", 0, 0)),
    ]
    batch = on_device(dict(spec.processor(texts, images=[[load_image(image_path)], []])))
    kwargs = dict(
        max_new_tokens=12,
        logits_processor=transformers.LogitsProcessorList([AlternatingParity()]),
        return_dict_in_generate=True,
        output_scores=True,
        **greedy_override(family),
    )
    unstopped = spec.target.generate(**batch, **kwargs)
    first = unstopped.sequences[0, batch["input_ids"].shape[1] :].tolist()
    at = next(j for j in range(3, len(first)) if first[j] not in first[:j])
    kwargs.update(stop_strings=[tokenizer.decode(first[at : at + 1])], tokenizer=tokenizer)
    expected = spec.target.generate(**batch, **kwargs)
    got = spec.generate(**batch, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert not torch.equal(expected.sequences[0], unstopped.sequences[0])
    assert len(got.scores) == len(expected.scores)
    for mine, theirs in zip(got.scores[: at + 1], expected.scores, strict=False):
        torch.testing.assert_close(mine[0], theirs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_wrapped_transformers_models_decode_like_the_target(replica_pairs, image_path, reference, family):
    """Models loaded by `transformers`, wrapped, then moved to the test device: inputs follow the models."""
    loaded = []
    for directory in replica_pairs[family]:
        model_class = getattr(transformers, transformers.AutoConfig.from_pretrained(directory).architectures[0])
        loaded.append(model_class.from_pretrained(directory, dtype=torch.float32))
    spec = SpeculativeVLM(target=loaded[0], draft=loaded[1])
    spec.target.to(DEVICE)
    spec.draft.to(DEVICE)
    inputs = chat_inputs(load_processor(replica_pairs[family][0]), PROMPT, images=[load_image(image_path)])
    ids = spec.generate(**inputs, max_new_tokens=NEW_TOKENS, **greedy_override(family))
    assert torch.equal(ids[0, inputs["input_ids"].shape[1] :], reference(family)[0])


@pytest.fixture(scope="module")
def pipelines(replica_pairs):
    """Per family: `vlmspec.pipeline` on the pair's directories, and `transformers`' own pipeline on its target."""

    @cache
    def build(family: str):
        target, draft = replica_pairs[family]
        pipe = vlmspec.pipeline("image-text-to-text", model=target, draft_model=draft, device_map=device_map())
        plain = transformers.pipeline("image-text-to-text", model=pipe.model, processor=pipe.processor)
        return pipe, plain

    return build


def _chat(image_path: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image", "image": image_path}, {"type": "text", "text": PROMPT}]}]


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_answers_images_and_text_like_the_transformers_pipeline(pipelines, image_path, family):
    pipe, plain = pipelines(family)
    text = PLACEHOLDERS.get(family, QWEN_PLACEHOLDER) + PROMPT
    answers = [
        call(images=image_path, text=text, generate_kwargs=dict(max_new_tokens=NEW_TOKENS, **greedy_override(family)))
        for call in (pipe, plain)
    ]
    assert answers[0] == answers[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_answers_a_chat_turn_like_the_target(pipelines, image_path, reference, family):
    pipe, _ = pipelines(family)
    answer = pipe(
        text=_chat(image_path),
        return_full_text=False,
        max_new_tokens=NEW_TOKENS,
        generate_kwargs=greedy_override(family),
    )
    assert answer == [{"input_text": _chat(image_path), "generated_text": reference(family)[1]}]


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_answers_a_video_turn_like_the_target(pipelines, family):
    pipe, _ = pipelines(family)
    frames = sample_frames(3, num_frames=4, size=(48, 64))
    turn = [
        {"role": "user", "content": [{"type": "video", "video": frames}, {"type": "text", "text": "What happens?"}]}
    ]
    answer = pipe(text=turn, return_full_text=False, max_new_tokens=NEW_TOKENS, generate_kwargs=greedy_override(family))
    inputs = on_device(chat_inputs(pipe.visual_inputs, "What happens?", video=frames))
    ids = pipe.model.generate(**inputs, max_new_tokens=NEW_TOKENS, **greedy_override(family))
    expected = pipe.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer[0]["generated_text"] == expected


@pytest.mark.parametrize("family", SAMPLING)
def test_pipeline_samples_the_released_config_the_same_for_the_same_seed(pipelines, image_path, reference, family):
    pipe, _ = pipelines(family)

    def sample(seed: int) -> str:
        torch.manual_seed(seed)
        (answer,) = pipe(text=_chat(image_path), return_full_text=False, max_new_tokens=NEW_TOKENS)
        return answer["generated_text"]

    text = sample(0)
    assert text != reference(family)[1]
    assert sample(0) == text


def _cli_pair(family: str, replica_pairs) -> list[str]:
    target, draft = replica_pairs[family]
    return ["--model", target, "--draft", draft, "--max-new-tokens", str(NEW_TOKENS), *device_flags()]


def _cli_flags(family: str, replica_pairs) -> list[str]:
    """The pair, plus `--greedy` for the sampling families."""
    return [*_cli_pair(family, replica_pairs), *(["--greedy"] if family in SAMPLING else [])]


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_generate_prints_the_targets_own_text(replica_pairs, image_path, reference, capsys, family):
    main(["generate", PROMPT, "--image", image_path, *_cli_flags(family, replica_pairs)])
    assert capsys.readouterr().out == reference(family)[1] + "\n"


def _caption_record(image_path: str, out, flags: list[str]) -> dict:
    """`vlmspec caption` of the one image into `out`: its record."""
    main(["caption", image_path, "--out", str(out), "--no-progress", *flags])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    return record


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_caption_records_the_targets_own_text(replica_pairs, image_path, reference, tmp_path, family):
    record = _caption_record(image_path, tmp_path / "captions.jsonl", _cli_flags(family, replica_pairs))
    new_ids, text = reference(family)
    assert (record["caption"], record["new_tokens"]) == (text, len(new_ids))


@pytest.mark.parametrize("family", SAMPLING)
def test_cli_generate_samples_the_released_config_the_same_for_the_same_seed(
    replica_pairs, image_path, reference, capsys, family
):
    texts = []
    for _ in range(2):
        main(["generate", PROMPT, "--image", image_path, *_cli_pair(family, replica_pairs), "--seed", "0"])
        texts.append(capsys.readouterr().out)
    assert texts[0] != reference(family)[1] + "\n"
    assert texts[1] == texts[0]


@pytest.mark.parametrize("family", SAMPLING)
def test_cli_caption_samples_the_released_config_the_same_for_the_same_seed(
    replica_pairs, image_path, reference, tmp_path, family
):
    flags = [*_cli_pair(family, replica_pairs), "--seed", "0"]
    captions = [
        _caption_record(image_path, tmp_path / name, flags)["caption"] for name in ("first.jsonl", "again.jsonl")
    ]
    assert captions[0] != reference(family)[1]
    assert captions[1] == captions[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_vlmspec_serve_answers_with_the_targets_own_text(replica_pairs, image_path, reference, family):
    from openai import OpenAI
    from serving import RunningServer, data_url

    from vlmspec.serve.app import ServerOptions

    spec = load_pair(*replica_pairs[family], device_map=device_map())
    running = RunningServer(spec.with_options(), ServerOptions("replica"), batch_size=4)
    try:
        client = OpenAI(base_url=running.url, api_key="unused", max_retries=0)
        image = {"type": "image_url", "image_url": {"url": data_url(image_path, "image")}}
        messages = [{"role": "user", "content": [image, {"type": "text", "text": PROMPT}]}]
        greedy = {"temperature": 0} if family in SAMPLING else {}
        answer = client.chat.completions.create(model="replica", messages=messages, max_tokens=NEW_TOKENS, **greedy)
        assert answer.choices[0].message.content == reference(family)[1]
        if family in SAMPLING:
            first, second = (
                client.chat.completions.create(model="replica", messages=messages, max_tokens=NEW_TOKENS, seed=3)
                for _ in range(2)
            )
            assert first.choices[0].message.content == second.choices[0].message.content
    finally:
        running.close()
