"""A new draft head for a target, as EAGLE-3 starts one: its config sized from the target, and its weights before
training."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .config import HeadConfig
from .fit import target_mrope_section
from .module import Eagle3Head


def head_config_for(
    target: PreTrainedModel,
    draft_vocab: int | None = None,
    layer_ids: list[int] | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    rope_theta: float | None = None,
) -> HeadConfig:
    """The config of a head drafting for `target`: its hidden size and vocabulary, its kind of positions (M-RoPE
    sections from its text config; interleaved for Qwen3-VL), one layer shaped like the target's by default."""
    text = target.config.get_text_config()
    heads = heads or text.num_attention_heads
    head_dim = head_dim or getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    mrope = target_mrope_section(target)
    rope = getattr(text, "rope_parameters", None) or {}
    interleaved = bool(rope.get("mrope_interleaved")) or "qwen3" in getattr(text, "model_type", "")
    if mrope is not None and sum(mrope) != head_dim // 2:
        mrope = [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6]
    vocab = target.get_output_embeddings().weight.shape[0]
    return HeadConfig(
        hidden_size=text.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or getattr(text, "num_key_value_heads", heads),
        head_dim=head_dim,
        intermediate_size=intermediate_size or 2 * text.hidden_size,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab or vocab,
        rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta or rope.get("rope_theta", 10000.0),
        mrope_section=mrope,
        mrope_interleaved=interleaved and mrope is not None,
        aux_layer_ids=layer_ids,
    )


@torch.no_grad()
def new_head(
    target: PreTrainedModel, draft_ids: torch.Tensor, intermediate_size: int | None = None, seed: int = 0
) -> Eagle3Head:
    """A head for `target` over the draft vocabulary `draft_ids` (sorted target ids, (Vd,)), float32 on the target's
    device, bound to its embeddings: `fc` and the layer drawn as transformers initialises a Llama layer (normal, std
    0.02; norms 1), the output norm and `lm_head` copied from the target's final norm and its output rows of the
    draft ids (the head's output lives in the target's hidden space, as the features it is trained to extend do),
    `d2t` and `t2d` from the ids. The layer is as wide as the target's, its MLP `intermediate_size` (default: the
    target's own, as the released heads are). It reads the default layers, or on a target of fewer than 5 layers its
    lowest, middle and last (named, as SGLang reads names)."""
    text = target.config.get_text_config()
    layers = text.num_hidden_layers
    # The default layers (2, L // 2, L - 3) need 5; a shallower target's head names the lowest, middle and last.
    layer_ids = None if layers >= 5 else [0, max(layers // 2 - 1, 0), layers - 1]
    config = head_config_for(
        target,
        draft_vocab=len(draft_ids),
        layer_ids=layer_ids,
        intermediate_size=intermediate_size or text.intermediate_size,
    )
    generator = torch.Generator().manual_seed(seed)
    head = Eagle3Head(config)
    for parameter in head.parameters():
        if parameter.ndim == 2:
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    output = target.get_output_embeddings().weight
    head.lm_head.weight.copy_(output[draft_ids.to(output.device)].float().cpu())
    head.norm.weight.copy_(target.get_decoder().norm.weight.float().cpu())
    ids = draft_ids.cpu().long()
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d.zero_()
    head.t2d[ids] = True
    embeddings = target.get_input_embeddings()
    return head.to(device=embeddings.weight.device).bind(embeddings)
