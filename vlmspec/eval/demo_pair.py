"""The demo pair's architecture: a Qwen2.5-VL target (~20 M language-model parameters) and a ~0.7 M draft."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..processors import QwenVideoPacker, QwenVideoPatcher, VisualInputs, image_only
from ..testing.tokenizer import QWEN_CHAT_TEMPLATE, QWEN_SPECIAL_TOKENS
from .synthetic import IMAGE_SIZE, corpus

VOCAB_SIZE = 1024
PIXELS = IMAGE_SIZE * IMAGE_SIZE

TARGET = dict(hidden_size=512, num_layers=7, heads=8, kv_heads=2, intermediate=1376, vision_depth=4, vision_hidden=192)
DRAFT = dict(hidden_size=128, num_layers=2, heads=2, kv_heads=1, intermediate=384, vision_depth=2, vision_hidden=64)


def build_demo_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the suite's captions, with the Qwen-VL special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN_CHAT_TEMPLATE
    )


def build_demo_processor(tokenizer: PreTrainedTokenizerFast) -> VisualInputs:
    """112x112 images (16 visual tokens) and 8-frame videos (64 visual tokens)."""
    processor = image_only(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=PIXELS, max_pixels=PIXELS),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return VisualInputs(
        processor, QwenVideoPacker(QwenVideoPatcher(min_pixels=PIXELS, max_pixels=PIXELS), timestamps=False)
    )


def build_model(tokenizer: PreTrainedTokenizerFast, spec: dict) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL of the given size, sharing `tokenizer`'s ids."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    head_dim = spec["hidden_size"] // spec["heads"]
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=spec["hidden_size"],
            intermediate_size=spec["intermediate"],
            num_hidden_layers=spec["num_layers"],
            num_attention_heads=spec["heads"],
            num_key_value_heads=spec["kv_heads"],
            max_position_embeddings=2048,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16],
                "rope_theta": 10000.0,
            },
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=spec["vision_depth"],
            hidden_size=spec["vision_hidden"],
            intermediate_size=spec["vision_hidden"] * 2,
            num_heads=max(1, spec["vision_hidden"] // 64),
            out_hidden_size=spec["hidden_size"],
            fullatt_block_indexes=list(range(1, spec["vision_depth"], 2)),
            window_size=IMAGE_SIZE,
            tokens_per_second=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model


def language_model_parameters(model: Qwen2_5_VLForConditionalGeneration) -> int:
    """Parameters of the language model and output head (the vision tower excluded)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual"))
