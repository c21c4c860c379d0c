"""`vlmspec profile`: launches and host reads per decoding step, counted on any device."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from vlmspec import SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.device_tensors import host_values
from vlmspec.eval.profile import LaunchCounter, Profile, markdown_table, profile_generate, profile_policy
from vlmspec.eval.trace_counts import TraceCounts
from vlmspec.testing import noisy_copy, tiny_qwen2_5_vl
from vlmspec.testing.heads import random_head


def test_counts_are_split_between_the_target_the_draft_and_the_rest(cases):
    target = tiny_qwen2_5_vl(0).to(DEVICE)
    draft = noisy_copy(target, 0.05)
    counter = LaunchCounter(target, draft)
    with counter.counting(), torch.inference_mode():
        target(**{k: v for k, v in cases["text"].items() if k != "mm_token_type_ids"})
        torch.ones(3).add_(1)
    counter.remove()
    assert counter.launches["target"] > 10 and counter.launches["draft"] == 0 and counter.launches["own"] >= 2


def test_the_counter_counts_each_models_forwards():
    target, draft = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    counter = LaunchCounter(target, draft)
    x = torch.ones(1, 2)
    with counter.counting():
        target(x), draft(x), draft(x)
    counter.remove()
    assert counter.forwards == {"target": 1, "draft": 2}


def test_a_heads_level_launches_fewer_kernels_than_a_whole_draft_models(cases):
    """A head's forward is one layer beside the target's features; a draft model's, every layer of a model."""
    target = tiny_qwen2_5_vl(0)
    target.generation_config.eos_token_id = None
    per_forward = {}
    for kind, draft in (("head", random_head(target, layer_ids=[0, 0, 1])), ("model", noisy_copy(target, 0.05))):
        profile = profile_policy(SpeculativeVLM(target, draft), "chain", cases["image"], 24, "greedy")
        assert profile.forwards["draft"] >= profile.steps, kind
        per_forward[kind] = profile.draft_launches_per_forward
    assert per_forward["head"] < per_forward["model"]


def test_reads_count_what_makes_a_host_wait():
    counter = LaunchCounter(torch.nn.Identity())
    x = torch.arange(6)
    with counter.counting():
        bool(x.any()), int(x[0]), x.tolist(), x.nonzero(), x[x > 2]
        x + 1, x[1:3], x.view(2, 3)
    assert counter.reads["own"] == 5


@pytest.mark.parametrize("config", ["greedy", "qwen2.5-vl released"])
def test_a_step_reads_the_device_once_for_static_trees(cases, config):
    target = tiny_qwen2_5_vl(0)
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05))
    profile = profile_policy(spec, "static-tree", cases["image"], 24, config)
    assert profile.per("step")["own reads"] == pytest.approx(1.0)


def test_the_decoders_own_launches_do_not_grow_with_the_layers(cases):
    """Whichever model is profiled first in the process, what is made once (tree shapes, their masks) is made in the
    profile's uncounted first call, so the counts are the steps' own."""
    per_step = []
    for layers in (1, 4):
        target = tiny_qwen2_5_vl(0, num_layers=layers)
        target.generation_config.eos_token_id = None  # every call runs to its budget
        profile = profile_policy(SpeculativeVLM(target, target), "static-tree", cases["image"], 24, "greedy")
        per_step.append(profile.per("step")["own launches"])
    assert per_step[0] == per_step[1]


def test_the_table_has_a_row_per_method(cases):
    target = tiny_qwen2_5_vl(0)
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05))
    rows = [
        profile_generate(target, cases["text"], 12, "greedy"),
        profile_policy(spec, "sage", cases["text"], 12, "greedy"),
    ]
    table = markdown_table(rows)
    assert table.count("\n") == 3 and "| generate | greedy |" in table and "| sage | greedy |" in table


def test_a_compiled_pairs_table_counts_regions_operators_outside_them_reads_and_graphs_per_step():
    none = {scope: 0.0 for scope in ("target", "draft", "own")}
    traced = TraceCounts(regions=30, outside=200, reads=10, compiled=2)
    table = markdown_table([Profile("sage", "greedy", 10, 30, none, none, traced)])
    assert "compiled regions" in table.splitlines()[0]
    assert table.splitlines()[-1] == "| sage | greedy | 10 | 3.00 | 3.0 | 20 | 1.0 | 2 |"


def test_indexing_with_a_zero_dim_tensor_counts_as_a_read():
    counter = LaunchCounter(torch.nn.Identity())
    x, i = torch.arange(6), torch.tensor(2)
    with counter.counting():
        x[i]
        x.index_select(0, i.view(1))
        int(x[0])
    assert counter.reads["own"] == 2


def test_a_blocking_copy_of_host_values_to_a_device_counts_as_a_read():
    """Such a copy waits for every queued kernel first; a non-blocking one (from pinned memory) does not wait."""
    counter = LaunchCounter(torch.nn.Identity())
    with counter.counting():
        torch.tensor([1, 2]).to("meta")
        torch.empty(2, dtype=torch.long, device="meta").copy_(torch.tensor([1, 2]))
        torch.tensor([1, 2]).to("meta", non_blocking=True)
        torch.tensor([1, 2]).to(torch.float32)
    assert counter.reads["own"] == 2


def test_host_values_are_int64_on_the_device_asked_for():
    values = host_values([3, 4], DEVICE)
    assert values.dtype == torch.long and values.device.type == DEVICE.type and values.tolist() == [3, 4]


def test_a_batched_step_reads_the_device_once_for_all_its_rows(cases):
    target = tiny_qwen2_5_vl(0)
    target.generation_config.eos_token_id = None  # the rows run in step to their budget
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05))
    profile = profile_policy(spec, "static-tree", cases["image"], 24, "greedy", batch_size=4)
    assert profile.method == "static-tree, B=4"
    assert profile.per("step")["own reads"] == pytest.approx(1.0)
    assert profile.tokens > 4 * profile.steps


@pytest.mark.parametrize("policy", ["chain", "static-tree"])
@pytest.mark.parametrize("config", ["greedy", "qwen2.5-vl released"])
def test_a_batched_step_of_one_tree_shape_costs_the_same_launches_at_every_batch_size(cases, policy, config):
    """Rows drafting one tree of rank paths step as one set of tensors: their own launches per step do not grow with
    the rows (the rows' sequences are written back once each, when they finish)."""
    target = tiny_qwen2_5_vl(0)
    target.generation_config.eos_token_id = None
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05))
    two, eight = (profile_policy(spec, policy, cases["image"], 24, config, batch_size=b) for b in (2, 8))
    assert two.steps == eight.steps
    assert eight.per("step")["own launches"] <= two.per("step")["own launches"] + 6 / two.steps
    assert eight.per("step")["own reads"] == pytest.approx(1.0)


def test_stop_strings_are_read_with_the_steps_one_read(qwen):
    target = tiny_qwen2_5_vl(0)
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05), processor=qwen.processor)
    profile = profile_policy(spec, "static-tree", qwen.cases["image"], 24, "greedy + stop strings")
    assert profile.per("step")["own reads"] == pytest.approx(1.0)


@pytest.mark.parametrize("config", ["greedy + Python criterion", "greedy + custom processor"])
def test_python_criteria_and_custom_processors_add_one_read_a_step_at_every_batch_size(qwen, config):
    """One read more than the step's own: the criteria's answers, or the verified nodes' depths (the short run's last
    step, whose tree is its root alone, has no depths to read, so the per-step difference may count a quarter more)."""
    target = tiny_qwen2_5_vl(0)
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05), processor=qwen.processor)
    for batch_size in (1, 4):
        profile = profile_policy(spec, "static-tree", qwen.cases["image"], 24, config, batch_size)
        assert profile.per("step")["own reads"] == pytest.approx(2.0, abs=0.3), batch_size


@pytest.mark.parametrize("config", ["greedy", "qwen2.5-vl released"])
def test_a_plain_step_asks_no_more_of_a_gpu_than_generates_own_step(cases, config):
    """Where drafting does not pay, the default's step is the target's one-token forward, processed, chosen and read
    once: no draft launch, and no more launches in all, nor reads, than `generate`'s step, at one row and at four."""
    target = tiny_qwen2_5_vl(0)
    target.generation_config.eos_token_id = None
    spec = SpeculativeVLM(target, noisy_copy(target, 0.05))
    for batch_size in (1, 4):
        inputs = cases["image"]
        if batch_size > 1:
            inputs = adapter_for(spec.target).join_rows([inputs] * batch_size, 0)
        generate = profile_generate(target, inputs, 24, config).per("step")
        plain = profile_policy(spec, "plain", cases["image"], 24, config, batch_size).per("step")
        assert plain["draft launches"] == 0
        assert plain["target launches"] <= generate["target launches"], batch_size
        total = plain["target launches"] + plain["own launches"]
        assert total <= generate["target launches"] + generate["own launches"], batch_size
        assert plain["own reads"] == pytest.approx(1.0) == generate["own reads"]
