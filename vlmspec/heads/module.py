"""A draft head in the EAGLE-3 layout, as a small torch module: one decoder layer over the target's own features.

Submodules and buffers carry the layout's names, so a state dict loads and saves as SpecForge writes it: `fc`
[H, 3H]; `midlayer.{hidden_norm, input_layernorm, post_attention_layernorm}`; `midlayer.self_attn.{q,k,v,o}_proj`
(q, k and v read 2H: the token's embedding, normed, beside the feature, normed); `midlayer.mlp.{gate,up,down}_proj`;
`norm`; `lm_head` [Vd, H]; `d2t` [Vd] (target id = draft id + d2t[draft id]); `t2d` [V] bool. The head has no
embeddings of its own: it embeds tokens with the target's (`bind`).

A forward at cache entry j reads the token after the feature's position beside the feature (the target's, projected
by `fc`, or the head's own pre-norm output at the node's parent), attends over the head's earlier entries, and
returns its logits over the target's vocabulary (-inf outside the draft vocabulary) with its pre-norm output, which
the next level feeds back (EAGLE-3: the residual is the projected feature).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput

from ..errors import HeadLayoutError
from .config import HeadConfig
from .rope import HeadRotary, rotate


class RMSNorm(nn.Module):
    """Llama's RMS norm: computed in float32, scaled by `weight` in the input's dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden.to(dtype)


class HeadAttention(nn.Module):
    """The head's self-attention over 2H inputs, through transformers' attention interface (so vlmspec's tree
    attention serves it as it serves the families' layers)."""

    def __init__(self, config: HeadConfig, text_config: LlamaConfig):
        super().__init__()
        self.config = text_config
        self.layer_idx = 0
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.head_dim**-0.5
        self.is_causal = True
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache,
    ) -> torch.Tensor:
        batch, q = hidden.shape[:2]
        shape = (batch, q, -1, self.head_dim)
        query = self.q_proj(hidden).view(shape).transpose(1, 2)
        key = self.k_proj(hidden).view(shape).transpose(1, 2)
        value = self.v_proj(hidden).view(shape).transpose(1, 2)
        query, key = rotate(query, *rotary), rotate(key, *rotary)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attend: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, sdpa_attention_forward
        )
        out, _ = attend(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling)
        return self.o_proj(out.reshape(batch, q, -1))


class HeadMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


class HeadLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over [input_layernorm(embedding); hidden_norm(feature)], the feature the
    residual; then the MLP."""

    def __init__(self, config: HeadConfig, text_config: LlamaConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = HeadAttention(config, text_config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = HeadMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self,
        embedded: torch.Tensor,
        feature: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache,
    ) -> torch.Tensor:
        joined = torch.cat([self.input_layernorm(embedded), self.hidden_norm(feature)], dim=-1)
        hidden = feature + self.self_attn(joined, rotary, attention_mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@dataclass
class HeadOutput(ModelOutput):
    """A head forward's logits `(B, kept, V)` over the target's vocabulary and its pre-norm output `(B, q, H)`, what
    a child node feeds back as its feature."""

    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


class Eagle3Head(nn.Module):
    """A one-layer EAGLE-3 draft head (see the module's docstring for the layout). `bind(embeddings)` gives it the
    target's token embeddings, which it reads and never saves."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.head_config = config
        hidden = config.hidden_size
        self.config = LlamaConfig(
            hidden_size=hidden,
            num_hidden_layers=1,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            rms_norm_eps=config.rms_norm_eps,
        )
        self.config._attn_implementation = "sdpa"
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.midlayer = HeadLayer(config, self.config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = HeadRotary(config.head_dim, config.rope_theta, config.mrope_section, config.mrope_interleaved)
        self._embeddings: list[nn.Embedding] = []

    def bind(self, embeddings: nn.Embedding) -> Eagle3Head:
        """Embed tokens with the target's `embeddings` (held by reference, outside the head's state dict)."""
        if embeddings.weight.shape[1] != self.head_config.hidden_size:
            raise HeadLayoutError(
                f"the target's embeddings are {embeddings.weight.shape[1]} wide, the head's hidden_size "
                f"{self.head_config.hidden_size}"
            )
        self._embeddings = [embeddings]
        return self

    @property
    def layers(self) -> list[HeadLayer]:
        """The head's decoder layers (one), as the runners read a language model's."""
        return [self.midlayer]

    @property
    def bound(self) -> bool:
        return bool(self._embeddings)

    def get_input_embeddings(self) -> nn.Embedding:
        if not self._embeddings:
            raise RuntimeError("the head has no embeddings: bind it to its target's (Eagle3Head.bind)")
        return self._embeddings[0]

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def draft_to_target(self) -> torch.Tensor:
        """Each draft id's target id `(Vd,)`: draft id + d2t[draft id]."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated features `(..., 3H)` projected to the head's width by `fc`; the head's own
        outputs `(..., H)` pass as they are."""
        return features if features.shape[-1] == self.head_config.hidden_size else self.fc(features)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `(..., Vd)` over the draft vocabulary of the head's pre-norm outputs `hidden` `(..., H)`."""
        return self.lm_head(self.norm(hidden))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        logits_to_keep: int | torch.Tensor = 0,
        **_: object,
    ) -> HeadOutput:
        """One pass over `input_ids` `(B, q)` at `position_ids` `(B, q)` or `(3, B, q)`, each token beside its
        `features` `(B, q, 3H)` (the target's hidden states) or `(B, q, H)` (the head's own, at its parent), attending
        through `attention_mask` (additive, 4-D, or None) over `cache`. Logits of the last `logits_to_keep` tokens
        (0: all; a tensor: those indices) over the target's vocabulary."""
        embedded = self.get_input_embeddings()(input_ids).to(self.fc.weight.dtype)
        feature = self.project(features.to(self.fc.weight.dtype))
        rotary = self.rotary(position_ids, feature.dtype)
        hidden = self.midlayer(embedded, feature, rotary, attention_mask, cache)
        kept = hidden[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else hidden[:, logits_to_keep]
        draft_logits = self.draft_logits(kept)
        logits = draft_logits.new_full((*draft_logits.shape[:-1], self.head_config.vocab_size), -torch.inf)
        logits = logits.index_copy(-1, self.draft_to_target(), draft_logits)
        return HeadOutput(logits=logits, hidden_states=hidden)
