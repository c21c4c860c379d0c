"""Whether a draft head fits its target: the same hidden size and vocabulary, positions of the same kind (M-RoPE for
Qwen targets, 1-D for LLaVA-OneVision), feature layers the target has, and ids inside the target's vocabulary."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..errors import HeadLayoutError
from .module import Eagle3Head


def target_mrope_section(target: PreTrainedModel) -> list[int] | None:
    """The target's M-RoPE sections (None: 1-D RoPE), as its text config states them."""
    text = target.config.get_text_config()
    for stated in (getattr(text, "rope_parameters", None), getattr(text, "rope_scaling", None)):
        if isinstance(stated, dict) and stated.get("mrope_section"):
            return list(stated["mrope_section"])
    return None


def check_head(head: Eagle3Head, target: PreTrainedModel) -> list[int]:
    """Refuse a head that does not fit `target`, naming the field; returns the target layers whose input hidden
    states the head reads (`HeadConfig.feature_layers`)."""
    config, text = head.head_config, target.config.get_text_config()
    if config.hidden_size != text.hidden_size:
        raise HeadLayoutError(
            f"the head's hidden_size is {config.hidden_size}, its target's (hidden_size of "
            f"{type(target).__name__}) {text.hidden_size}"
        )
    target_vocab = target.get_output_embeddings().weight.shape[0]
    if config.vocab_size != target_vocab:
        raise HeadLayoutError(
            f"the head's vocab_size is {config.vocab_size}, its target's output vocabulary {target_vocab}"
        )
    mrope = target_mrope_section(target)
    if (mrope is None) != (config.mrope_section is None):
        wanted = "rope_scaling.mrope_section (M-RoPE, as the target positions its tokens)" if mrope else "1-D RoPE"
        raise HeadLayoutError(
            f"the head's rope_scaling.mrope_section is {config.mrope_section}, but its target "
            f"({type(target).__name__}) needs {wanted}: the head is of another family"
        )
    mapped = int((torch.arange(head.d2t.shape[0], device=head.d2t.device) + head.d2t).max())
    if mapped >= target_vocab or int(head.d2t.min()) < -head.d2t.shape[0]:
        raise HeadLayoutError(
            f"the head's d2t maps draft ids to target id {mapped}, outside the target's {target_vocab}"
        )
    return config.feature_layers(text.num_hidden_layers)
