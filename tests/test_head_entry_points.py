"""Heads in the released layouts load through every entry point: replicas of SpecForge's Qwen2.5-VL-7B head and of
an AngelSlim Qwen3-VL head (their config fields, tiny sizes, random weights) as `--draft`, `from_pretrained`'s draft
and `vlmspec.generate(draft=...)`, each decoding the target's own output."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import FAMILIES, save_pair
from test_cli import PROMPT, printed

import vlmspec
from vlmspec import SpeculativeVLM
from vlmspec.heads import save_head
from vlmspec.testing import sample_image
from vlmspec.testing.heads import random_head

#: Per family, the released layout replicated: SpecForge writes `LlamaForCausalLMEagle3` with M-RoPE sections and the
#: default layers; AngelSlim's Qwen3-VL heads write `Eagle3LlamaForCausalLM`, interleaved M-RoPE and named layers.
LAYOUTS = {
    "qwen2_5_vl": dict(architectures=["LlamaForCausalLMEagle3"], layer_ids=None, draft_vocab=128),
    "qwen3_vl": dict(architectures=["Eagle3LlamaForCausalLM"], layer_ids=[0, 0, 1], draft_vocab=128),
}


def write_head_pair(family_name: str, root) -> tuple[str, str]:
    """The family's tiny target (6 layers where the default layers are read) and a replica head beside it."""
    family = FAMILIES[family_name]
    layout = LAYOUTS[family_name]
    target_dir, _ = save_pair(family, root)
    target = type(family.target).from_pretrained(target_dir)
    if layout["layer_ids"] is None:  # the default layers 2, L // 2 and L - 3 need a target of at least 5 layers
        config = copy.deepcopy(family.target.config)
        config.text_config.num_hidden_layers = 6
        config.text_config.layer_types = ["full_attention"] * 6
        torch.manual_seed(0)
        target = type(family.target)(config).eval()
        target.save_pretrained(target_dir)
    head = random_head(target, layer_ids=layout["layer_ids"], draft_vocab=layout["draft_vocab"])
    head.head_config.architectures = layout["architectures"]
    head_dir = save_head(head, root / "head")
    return target_dir, str(head_dir)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def head_pair(request, tmp_path_factory):
    return request.param, write_head_pair(request.param, tmp_path_factory.mktemp(request.param))


def test_the_replica_configs_carry_the_released_fields(head_pair):
    name, (_, head_dir) = head_pair
    raw = json.loads(open(f"{head_dir}/config.json").read())
    assert raw["architectures"] == LAYOUTS[name]["architectures"] and raw["model_type"] == "llama"
    assert raw["rope_scaling"]["mrope_section"] and raw["draft_vocab_size"] < raw["vocab_size"]
    assert ("eagle_config" in raw) == (LAYOUTS[name]["layer_ids"] is not None)


def test_from_pretrained_loads_a_head_folder_as_the_draft(head_pair):
    name, (target_dir, head_dir) = head_pair
    spec = SpeculativeVLM.from_pretrained(target_dir, head_dir, policy="sage")
    inputs = FAMILIES[name].cpu_cases["image"]
    out = spec.generate(**inputs, do_sample=False, max_new_tokens=16)
    assert type(spec.draft).__name__ == "Eagle3Head"
    assert torch.equal(out, spec.target.generate(**inputs, do_sample=False, max_new_tokens=16))


def test_vlmspec_generate_takes_a_head_as_its_draft(head_pair):
    name, (target_dir, head_dir) = head_pair
    text, stats = vlmspec.generate(
        PROMPT, images=sample_image(0), model=target_dir, draft=head_dir, max_new_tokens=12, return_stats=True
    )
    spec = vlmspec.load_pair(target_dir, head_dir)
    processor = spec.processor
    inputs = FAMILIES[name].cpu_cases["image"]
    reference = spec.target.generate(**inputs, do_sample=False, max_new_tokens=12)
    assert text == processor.tokenizer.decode(reference[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert stats.new_tokens == 12


def test_the_command_line_takes_a_head_as_its_draft(head_pair, capsys):
    _, (target_dir, head_dir) = head_pair
    argv = ["generate", PROMPT, "--model", target_dir, "--draft", head_dir, "--max-new-tokens", "8"]
    spec = vlmspec.load_pair(target_dir, head_dir)
    assert printed(capsys, argv) == vlmspec.generate(PROMPT, model=target_dir, draft=head_dir, max_new_tokens=8)
    assert type(spec.draft).__name__ == "Eagle3Head"
