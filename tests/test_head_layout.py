"""A draft head's files follow the EAGLE-3 layout as SpecForge writes them and SGLang and vLLM read them; heads that do
not, or that do not fit their target, are refused naming the field; the target's features are the hidden states
transformers reports; the step's parents and M-RoPE axes on made-up tensors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILIES
from safetensors.torch import load_file, save_file

from vlmspec import SpeculativeVLM
from vlmspec.engine.features import FeatureTap
from vlmspec.engine.head_runner import parent_slots
from vlmspec.engine.tree import with_edges
from vlmspec.errors import HeadLayoutError
from vlmspec.heads import HeadConfig, check_head, load_head, save_head
from vlmspec.heads.rope import axis_of_frequencies
from vlmspec.testing.heads import random_head

#: The layout's weights and their shapes for hidden size H, intermediate I, heads n of D, kv heads m, vocabularies.
LAYOUT = {
    "fc.weight": lambda c: (c.hidden_size, 3 * c.hidden_size),
    "midlayer.hidden_norm.weight": lambda c: (c.hidden_size,),
    "midlayer.input_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "midlayer.self_attn.q_proj.weight": lambda c: (c.num_attention_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.k_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.v_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, 2 * c.hidden_size),
    "midlayer.self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "midlayer.mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "midlayer.mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "norm.weight": lambda c: (c.hidden_size,),
    "lm_head.weight": lambda c: (c.draft_vocab_size, c.hidden_size),
    "d2t": lambda c: (c.draft_vocab_size,),
    "t2d": lambda c: (c.vocab_size,),
}

#: The fields of the released Qwen2.5-VL-7B head's config.json (SpecForge), which vlmspec reads.
SPECFORGE_QWEN2_5_VL_7B = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 3584,
    "num_hidden_layers": 1,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "draft_vocab_size": 32000,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def qwen_target():
    return FAMILIES["qwen2_5_vl"].target


def test_a_specforge_config_is_read_with_its_fields_and_default_layers():
    config = HeadConfig.from_dict(SPECFORGE_QWEN2_5_VL_7B)
    assert (config.hidden_size, config.draft_vocab_size, config.mrope_section) == (3584, 32000, [16, 24, 24])
    assert config.feature_layers(28) == [2, 14, 25]


def test_named_layers_are_read_as_the_state_leaving_each_layer():
    raw = {**SPECFORGE_QWEN2_5_VL_7B, "architectures": ["Eagle3LlamaForCausalLM"]}
    raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [3, 17, 32]}
    assert HeadConfig.from_dict(raw).feature_layers(36) == [4, 18, 33]


@pytest.mark.parametrize(
    "change, named",
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architectures"),
        ({"num_hidden_layers": 2}, "num_hidden_layers"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_a_config_off_the_layout_is_refused_naming_the_field(change, named):
    raw = {k: v for k, v in {**SPECFORGE_QWEN2_5_VL_7B, **change}.items() if v is not None}
    with pytest.raises(HeadLayoutError, match=named):
        HeadConfig.from_dict(raw)


def test_named_layers_the_target_lacks_are_refused():
    raw = {**SPECFORGE_QWEN2_5_VL_7B, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 17, 40]}}
    with pytest.raises(HeadLayoutError, match="eagle_aux_hidden_state_layer_ids"):
        HeadConfig.from_dict(raw).feature_layers(36)


def test_a_saved_head_has_the_layouts_names_and_shapes_and_loads_back(qwen_target, tmp_path):
    head = random_head(qwen_target, layer_ids=[0, 0, 1], draft_vocab=100)
    folder = save_head(head, tmp_path / "head")
    state = load_file(str(folder / "model.safetensors"))
    config = head.head_config
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: shape(config) for k, shape in LAYOUT.items()}
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["num_hidden_layers"] == 1
    loaded = load_head(folder)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in head.state_dict().items())


def test_a_head_naming_its_layer_layers_0_loads_as_midlayer(qwen_target, tmp_path):
    head = random_head(qwen_target, layer_ids=[0, 0, 1])
    folder = save_head(head, tmp_path / "head")
    state = load_file(str(folder / "model.safetensors"))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    renamed["embed_tokens.weight"] = torch.zeros(3, 3)  # some writers keep the target's: it is not read
    save_file(renamed, str(folder / "model.safetensors"))
    assert torch.equal(load_head(folder).midlayer.mlp.up_proj.weight, head.midlayer.mlp.up_proj.weight)


@pytest.mark.parametrize("edit, named", [("drop", "midlayer.self_attn.q_proj.weight"), ("reshape", "lm_head.weight")])
def test_weights_off_the_layout_are_refused_naming_them(qwen_target, tmp_path, edit, named):
    folder = save_head(random_head(qwen_target, layer_ids=[0, 0, 1]), tmp_path / "head")
    state = load_file(str(folder / "model.safetensors"))
    if edit == "drop":
        del state[named]
    else:
        state[named] = state[named][:-1].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(HeadLayoutError, match=named.replace(".", r"\.")):
        load_head(folder)


@pytest.mark.parametrize(
    "options, named",
    [
        (dict(hidden_size=32), "hidden_size"),
        (dict(vocab_size=100), "vocab_size"),
        (dict(mrope_section=None), "mrope_section"),
    ],
)
def test_a_head_that_does_not_fit_its_target_is_refused_naming_the_field(qwen_target, options, named):
    from vlmspec.heads import Eagle3Head
    from vlmspec.heads.new import head_config_for

    config = head_config_for(qwen_target, layer_ids=[0, 0, 1])
    for key, value in options.items():
        setattr(config, key, value)
    head = Eagle3Head(config)
    with pytest.raises(HeadLayoutError, match=named):
        check_head(head, qwen_target)
    with pytest.raises(HeadLayoutError, match=named):
        SpeculativeVLM(qwen_target, head)


def test_the_tap_keeps_the_hidden_states_transformers_reports(qwen_target):
    """Layer i's kept state is transformers' `hidden_states[i]`; i = L is the last layer's output before the final
    norm (transformers' `hidden_states[L]` is after it)."""
    language_model = qwen_target.model.language_model
    tap = FeatureTap.on(language_model, [1, 1, 2])
    ids = torch.tensor([[3, 17, 42, 9, 11]])
    out = language_model(input_ids=ids, output_hidden_states=True)
    features = tap.take()
    width = language_model.config.hidden_size
    assert torch.equal(features[..., :width], out.hidden_states[1])
    # transformers reports the last state after the final norm; the head reads it before.
    assert not torch.equal(features[..., 2 * width :], out.hidden_states[2])
    assert torch.allclose(language_model.norm(features[..., 2 * width :]), out.last_hidden_state)


def test_each_nodes_parent_is_its_deepest_ancestor_before_it():
    # Slots 1..5: 1 and 2 children of the root, 3 of 1, 4 and 5 of 3; the level feeds slots 4 and 5.
    ancestors = torch.zeros(6, 6, dtype=torch.bool)
    for node, line in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 3, 4], 5: [0, 1, 3, 5]}.items():
        ancestors[node, line] = True
    visible = with_edges(ancestors[4:6, 1:6])
    assert parent_slots(visible, 2).tolist() == [3, 3]
    first = with_edges(ancestors[1:3, 1:3])
    assert parent_slots(first, 2).tolist() == [0, 0]
    assert parent_slots(visible[None].expand(2, -1, -1), 2).tolist() == [[3, 3], [3, 3]]


def test_m_rope_frequencies_follow_sections_or_interleave():
    assert axis_of_frequencies(8, [2, 3, 3], False).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert axis_of_frequencies(8, [2, 3, 3], True).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert axis_of_frequencies(8, None, False) is None
