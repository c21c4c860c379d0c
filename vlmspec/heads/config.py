"""A draft head's config in the EAGLE-3 layout (`config.json` as SpecForge writes it and SGLang and vLLM read it), and
which of the target's hidden states the head reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HeadLayoutError

#: The architecture SpecForge writes; AngelSlim writes `Eagle3LlamaForCausalLM`. Any name that starts or ends with
#: `Eagle3` is taken.
HEAD_ARCHITECTURE = "LlamaForCausalLMEagle3"


def is_head_architecture(names: list[str] | None) -> bool:
    """Whether a config's `architectures` names an EAGLE-3 head."""
    return any(name.startswith("Eagle3") or name.endswith("Eagle3") for name in names or [])


@dataclass
class HeadConfig:
    """The fields of an EAGLE-3 head's `config.json` vlmspec reads.

    `hidden_size` and `vocab_size` are the target's; the head's one layer has `num_attention_heads` query heads and
    `num_key_value_heads` key/value heads of `head_dim`, reading 2 x `hidden_size` (the token's embedding beside the
    feature); `draft_vocab_size` rows of output. `rope_theta`, and `mrope_section` (halves of `head_dim` per axis:
    time, height, width) with `mrope_interleaved` for Qwen targets, place its tokens as the target's are placed.
    `aux_layer_ids` are the layers the config names (`eagle_config.eagle_aux_hidden_state_layer_ids`), None for the
    default three."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    mrope_section: list[int] | None = None
    mrope_interleaved: bool = False
    aux_layer_ids: list[int] | None = None
    architectures: list[str] = field(default_factory=lambda: [HEAD_ARCHITECTURE])
    torch_dtype: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> HeadConfig:
        """Read and check a head's config; a missing or wrong field raises `HeadLayoutError` naming it."""
        if not is_head_architecture(raw.get("architectures")):
            raise HeadLayoutError(
                f"{where}: architectures is {raw.get('architectures')!r}; an EAGLE-3 head names {HEAD_ARCHITECTURE} "
                "(or another name starting or ending with Eagle3)"
            )
        if raw.get("num_hidden_layers", 1) != 1:
            raise HeadLayoutError(f"{where}: num_hidden_layers is {raw['num_hidden_layers']}; an EAGLE-3 head has 1")
        required = ["hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"]
        missing = [name for name in required if name not in raw]
        if missing:
            raise HeadLayoutError(f"{where}: missing {', '.join(missing)}")
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        eagle = raw.get("eagle_config") or {}
        layer_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            mrope_section=list(rope["mrope_section"]) if rope.get("mrope_section") else None,
            mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
            aux_layer_ids=None if layer_ids is None else [int(i) for i in layer_ids],
            architectures=list(raw["architectures"]),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> HeadConfig:
        path = Path(folder) / "config.json"
        return cls.from_dict(json.loads(path.read_text()), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The config as SpecForge writes it (`model_type` llama, one layer; the M-RoPE sections in `rope_scaling`)."""
        rope: dict[str, Any] = {"rope_type": "default"}
        if self.mrope_section is not None:
            rope = {"type": "mrope", "rope_type": "default", "mrope_section": list(self.mrope_section)}
            if self.mrope_interleaved:
                rope["mrope_interleaved"] = True
        raw: dict[str, Any] = {
            "architectures": list(self.architectures),
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope,
            "tie_word_embeddings": False,
        }
        if self.aux_layer_ids is not None:
            raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        if self.torch_dtype is not None:
            raw["torch_dtype"] = self.torch_dtype
        return raw

    def feature_layers(self, target_layers: int) -> list[int]:
        """The target's layers whose input hidden states the head reads, low to high as `fc` takes them
        (transformers' `hidden_states[i]`, i the layer the state enters; i = L is the last layer's output, before the
        final norm): 2, L // 2 and L - 3 by default; a named layer id k reads the state leaving layer k, i.e. entering
        k + 1 (SpecForge, which trains the released heads, and SGLang read named ids so; vLLM reads them as the
        state entering k)."""
        layers = (
            [2, target_layers // 2, target_layers - 3]
            if self.aux_layer_ids is None
            else [k + 1 for k in self.aux_layer_ids]
        )
        if len(layers) != 3 or any(not 0 <= i <= target_layers for i in layers):
            named = "eagle_config.eagle_aux_hidden_state_layer_ids" if self.aux_layer_ids else "the default layers"
            raise HeadLayoutError(
                f"{named} give the target's hidden states {layers}, but a head reads three of the "
                f"{target_layers + 1} states of a {target_layers}-layer target (0 to {target_layers})"
            )
        return layers
