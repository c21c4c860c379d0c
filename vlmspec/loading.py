"""Loading a target/draft pair from the hub or local directories: model classes, dtypes, devices, quantization."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, BitsAndBytesConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from .adapters import adapter_class_for, supported_model_classes
from .errors import UnsupportedAttentionError, UnsupportedModelError, VocabularyMismatchError

Quantization = str | BitsAndBytesConfig | None

#: Attention implementations vlmspec's tree attention is built over (`vlmspec.attention`).
TREE_ATTENTION = ("sdpa", "eager")


def check_attention(attn_implementation: str | None, model_name: str) -> None:
    """Refuse an attention implementation that cannot see a tree mask (`flash_attention_2` reads any mask as a
    2-D padding mask, so every tree node would attend to its siblings); None means the library's choice (SDPA)."""
    if attn_implementation is not None and attn_implementation not in TREE_ATTENTION:
        raise UnsupportedAttentionError(
            f"{model_name} uses attn_implementation={attn_implementation!r}, which cannot apply a tree attention "
            f"mask; load it with one of: {', '.join(TREE_ATTENTION)}"
        )


def check_model_attention(model: PreTrainedModel, role: str) -> None:
    """Refuse a loaded model whose language model attends through an implementation trees cannot use."""
    text_config = model.config.get_text_config()
    for config in (model.config, text_config):
        check_attention(getattr(config, "_attn_implementation", None), f"the {role} ({type(model).__name__})")


def model_class_for(path: str, **hub_kwargs: Any) -> type[PreTrainedModel]:
    """The `transformers` class that `path`'s config names, refused early when vlmspec has no adapter for it."""
    import transformers

    config = AutoConfig.from_pretrained(path, **hub_kwargs)
    names = list(getattr(config, "architectures", None) or [])
    mapped = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(config.model_type)
    if mapped:
        names.append(mapped)
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None and adapter_class_for(cls) is not None:
            return cls
    raise UnsupportedModelError(
        f"{path} holds a {config.model_type!r} model ({', '.join(names) or 'no architecture named'}); "
        f"vlmspec supports {', '.join(supported_model_classes())}"
    )


def checkpoint_dtype(path: str, torch_dtype: torch.dtype | str | None, **hub_kwargs: Any) -> torch.dtype:
    """The dtype the language model computes in: `torch_dtype` when given, else (`"auto"` or None, which
    `transformers` reads as `"auto"`) the checkpoint's own, as its text config states it; float32 if none does."""
    if isinstance(torch_dtype, torch.dtype):
        return torch_dtype
    if isinstance(torch_dtype, str) and torch_dtype != "auto":
        return getattr(torch, torch_dtype)
    config = AutoConfig.from_pretrained(path, **hub_kwargs)
    for stated in (getattr(config.get_text_config(), "dtype", None), getattr(config, "dtype", None)):
        if stated is not None:
            return getattr(torch, stated) if isinstance(stated, str) else stated
    return torch.float32


def quantization_config(
    quantization: Quantization, model_class: type[PreTrainedModel], compute_dtype: torch.dtype
) -> BitsAndBytesConfig | None:
    """`"8bit"`/`"4bit"` as bitsandbytes configs that keep the vision tower and output head unquantised; 4-bit
    weights are dequantised to `compute_dtype` (the model's own dtype, not bitsandbytes' float32 default)."""
    if quantization is None or isinstance(quantization, BitsAndBytesConfig):
        return quantization
    skip = list(adapter_class_for(model_class).quantization_skip_modules)
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype,
            llm_int8_skip_modules=skip,
        )
    raise ValueError(f"quantization must be None, '8bit', '4bit' or a BitsAndBytesConfig, got {quantization!r}")


def load_model(
    path: str,
    *,
    torch_dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    quantization: Quantization = None,
    attn_implementation: str | None = None,
    **hub_kwargs: Any,
) -> PreTrainedModel:
    """Load a supported VLM from the hub or a directory, in eval mode."""
    check_attention(attn_implementation, path)
    cls = model_class_for(path, **hub_kwargs)
    kwargs: dict[str, Any] = dict(hub_kwargs)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if quantization is not None:
        kwargs["quantization_config"] = quantization_config(
            quantization, cls, checkpoint_dtype(path, torch_dtype, **hub_kwargs)
        )
    return cls.from_pretrained(path, **kwargs).eval()


def check_tokenizers(target_path: str, draft_path: str, **hub_kwargs: Any) -> None:
    """Refuse a pair whose tokenizers map an id to different tokens (padding rows beyond either vocabulary are fine)."""
    target_vocab = AutoTokenizer.from_pretrained(target_path, **hub_kwargs).get_vocab()
    draft_vocab = AutoTokenizer.from_pretrained(draft_path, **hub_kwargs).get_vocab()
    target_tokens = {i: t for t, i in target_vocab.items()}
    for token, index in draft_vocab.items():
        if index in target_tokens and target_tokens[index] != token:
            raise VocabularyMismatchError(
                f"the tokenizers of {target_path} and {draft_path} differ: id {index} is {target_tokens[index]!r} "
                f"for the target but {token!r} for the draft"
            )
    if len(draft_vocab) != len(target_vocab):
        raise VocabularyMismatchError(
            f"the tokenizers of {target_path} ({len(target_vocab)} tokens) and {draft_path} "
            f"({len(draft_vocab)} tokens) differ in size"
        )
