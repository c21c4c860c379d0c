"""Random draft heads in the EAGLE-3 layout, sized for a target, for tests and measurements."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..heads import Eagle3Head
from ..heads.new import head_config_for


def random_head(target: PreTrainedModel, seed: int = 0, **options) -> Eagle3Head:
    """A random head for `target` (`head_config_for`'s `options`), in the target's dtype and on its device, bound to
    its embeddings; a draft vocabulary smaller than the target's is a random subset of its ids."""
    torch.manual_seed(seed)
    config = head_config_for(target, **options)
    head = Eagle3Head(config)
    for parameter in head.parameters():
        if parameter.ndim == 2:
            torch.nn.init.normal_(parameter, std=parameter.shape[1] ** -0.5)
    ids = torch.randperm(config.vocab_size)[: config.draft_vocab_size].sort().values
    head.d2t.copy_(ids - torch.arange(config.draft_vocab_size))
    head.t2d.zero_()
    head.t2d[ids] = True
    embeddings = target.get_input_embeddings()
    head = head.to(dtype=embeddings.weight.dtype, device=embeddings.weight.device).eval()
    return head.bind(embeddings)


def copying_pair(target: PreTrainedModel, scale: float = 3e5) -> tuple[PreTrainedModel, Eagle3Head]:
    """A target whose next token is a function of its current token alone, and a head that computes that function:
    its first draft token is the target's own next token at every step, wherever the conventions hold (the feature
    before each token, the token's embedding as the first half of what attention reads, the draft-to-target ids).

    The target (a copy of `target`) has every decoder layer's attention output and MLP output projections zeroed, so
    each text token's final hidden state is its embedding: it emits g(x), the argmax of its head over its normed
    embedding of x. Its embeddings get the same norm, and their first two dimensions place each id on a circle. The
    head attends, through its lowest-frequency rotary pair (a rope base of 1e12 keeps it still), only to entries of
    the same token as the query's (the circle's dot product, `scale` sharp), whose values are that token's normed
    embedding; its output norm and its rows are the target's, in a shuffled draft vocabulary. At the root, whose
    token is x, it then emits g(x)."""
    import copy

    target = copy.deepcopy(target)
    with torch.no_grad():
        for name, parameter in target.named_parameters():
            if ".language_model." in name and (name.endswith("o_proj.weight") or "down_proj" in name):
                parameter.zero_()
        embeddings = target.get_input_embeddings().weight
        vocab, hidden = embeddings.shape
        angle = 2 * torch.pi * torch.arange(vocab, dtype=torch.float64) / vocab
        rest = embeddings[:, 2:].double()
        rest[rest.norm(dim=1) == 0] = 1.0  # the padding row is zeros
        rest = rest / rest.norm(dim=1, keepdim=True) * (3.0**0.5)
        circle = torch.stack([angle.cos(), angle.sin()], 1)
        embeddings.copy_(torch.cat([circle, rest], 1).to(embeddings.dtype))
    head = _copying_head(target, hidden, vocab, scale)
    return target, head


def _copying_head(target: PreTrainedModel, hidden: int, vocab: int, scale: float) -> Eagle3Head:
    """The head of `copying_pair`: one attention head as wide as the target, attending by token."""
    config = head_config_for(target, heads=1, kv_heads=1, head_dim=hidden, rope_theta=1e12, layer_ids=None)
    config.aux_layer_ids = [0, 0, 0]
    head = Eagle3Head(config)
    last = hidden // 2 - 1  # the lowest-frequency rotary pair: (last, last + hidden / 2)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.zero_()
        for norm in (head.midlayer.input_layernorm, head.midlayer.hidden_norm, head.midlayer.post_attention_layernorm):
            norm.weight.fill_(1.0)
        attention = head.midlayer.self_attn
        for projection, factor in ((attention.q_proj, scale), (attention.k_proj, 1.0)):
            projection.weight[last, 0] = factor
            projection.weight[last + hidden // 2, 1] = factor
        attention.v_proj.weight[:, :hidden] = torch.eye(hidden)
        attention.o_proj.weight.copy_(torch.eye(hidden))
        head.norm.weight.copy_(target.model.language_model.norm.weight.float())
        order = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[order].float())
        head.d2t.copy_(order - torch.arange(vocab))
        head.t2d.fill_(True)
    embeddings = target.get_input_embeddings()
    return head.to(dtype=embeddings.weight.dtype, device=embeddings.weight.device).eval().bind(embeddings)
