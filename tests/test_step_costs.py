"""`scripts/step_costs.py` measures a step at the released sizes on a GPU; here it runs at the replicas' tiny sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import step_costs  # noqa: E402


@pytest.fixture(scope="module")
def results():
    argv = ["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--pairs", "qwen3_vl", "--contexts", "32,48"]
    return step_costs.main([*argv, "--nodes", "1,4,8", "--widths", "1,2", "--new-tokens", "4", "--repeats", "1"])


def test_every_context_gets_generate_verification_and_draft_level_costs(results):
    rows = results["qwen3_vl"]["contexts"]
    assert list(rows) == [32, 48]
    for row in rows.values():
        assert row["ar_ms_per_token"] > 0
        assert len(row["verify_ms"]) == 3 and min(row["verify_ms"]) > 0
        assert len(row["draft_level_ms"]) == 2 and min(row["draft_level_ms"]) > 0


def test_a_qwen_pair_gets_a_released_shape_heads_level_costs_own_time_and_projection(results):
    pair = results["qwen3_vl"]
    for row in pair["contexts"].values():
        assert len(row["head_level_ms"]) == 2 and min(row["head_level_ms"]) > 0
        assert set(row["head_projection"]) == {"paper", "released head"}
        assert row["head_projection"]["released head"]["chain"]["speedup"] > 0  # the released tau covers chains
    assert set(pair["head_own_ms_per_step"]) == set(step_costs.POLICIES)


def test_the_arithmetic_counts_a_heads_level_as_a_small_share_of_the_draft_models(capsys):
    """At Qwen2.5-VL-7B's size, a head's level reads its layer and a 32k output (well under a gigabyte), a 3B draft's
    level its whole model; the memory-bound speedup at the same tau follows."""
    (row,) = step_costs.main(["--arithmetic", "--pairs", "qwen2_5_vl", "--contexts", "8192"])["qwen2_5_vl"].values()
    assert 0.5e9 < row["head_level_bytes"] < 1e9 < 5e9 < row["draft_level_bytes"]
    assert row["head_first_bytes"] > row["head_level_bytes"]  # the first forward also reads fc
    chain = row["chain"]
    assert chain["head_speedup"] > 2 * chain["draft_speedup"]
    assert chain["draft_speedup"] == (1 + 3.67) * row["verify_bytes"] / (
        row["verify_bytes"] + 5 * row["draft_level_bytes"]
    )
    assert "| 8192 | chain | 5 |" in capsys.readouterr().out


def test_hf_assisted_generation_is_timed_or_its_refusal_stated(results):
    for row in results["qwen3_vl"]["contexts"].values():
        assisted = row["hf_assisted_ms_per_step"]
        assert (isinstance(assisted, float) and assisted > 0) or assisted.startswith("refused: ")


def test_each_policy_gets_its_own_time_and_a_projection_at_the_papers_tau(results):
    own = results["qwen3_vl"]["own_ms_per_step"]
    assert set(own) == set(step_costs.POLICIES) and all(o["ms"] >= 0 and o["steps"] > 0 for o in own.values())
    projection = results["qwen3_vl"]["contexts"][32]["projection"]
    assert projection["chain"]["speedup"] is None  # the paper reports no chain for Qwen3-VL
    assert projection["sage"]["speedup"] > 0 and projection["static-tree"]["speedup"] > 0


def test_the_projection_is_one_plus_tau_tokens_in_the_time_of_a_step():
    row = {"ar_ms_per_token": 10.0, "verify_ms": [20.0, 20.0], "draft_level_ms": [1.0, 1.0]}
    own = {policy: (2.0, 1) for policy in step_costs.POLICIES}
    projected = step_costs.projection(row, [1, 64], [1, 16], own, step_costs.PAPER_TAU["qwen2_5_vl"], "draft_level_ms")
    assert projected["chain"]["ms_per_step"] == 5 * 1.0 + 20.0 + 2.0
    assert projected["chain"]["speedup"] == (1 + 3.67) * 10.0 / 27.0
    assert projected["sage"]["ms_per_step"] == 8 * 1.0 + 20.0 + 2.0


def test_the_break_even_own_time_is_what_leaves_the_projection_at_exactly_plain_generates_speed():
    row = {"ar_ms_per_token": 10.0, "verify_ms": [20.0, 20.0], "draft_level_ms": [1.0, 1.0]}
    own = {policy: (2.0, 1) for policy in step_costs.POLICIES}
    taus = step_costs.PAPER_TAU

    def chain(name: str, own: dict) -> dict:
        return step_costs.projection(row, [1, 64], [1, 16], own, taus[name], "draft_level_ms")["chain"]

    break_even = chain("qwen2_5_vl", own)["own_break_even_ms"]
    assert break_even == (1 + 3.67) * 10.0 - (5 * 1.0 + 20.0)
    at_break_even = {policy: (break_even, 1) for policy in step_costs.POLICIES}
    assert chain("qwen2_5_vl", at_break_even)["speedup"] == 1.0
    assert chain("qwen3_vl", own)["speedup"] is None and chain("qwen3_vl", own)["own_break_even_ms"] is None


def test_the_json_is_written_as_it_is_measured_and_assisted_generation_can_be_left_out(tmp_path):
    out = tmp_path / "costs.json"
    argv = ["--scale", "tiny", "--device", "cpu", "--dtype", "float32", "--pairs", "llava_onevision"]
    argv += ["--contexts", "32", "--nodes", "1,4", "--widths", "1,2", "--new-tokens", "4", "--repeats", "1"]
    argv += ["--no-assisted"]
    results = step_costs.main([*argv, "--out", str(out)])
    written = json.loads(out.read_text())["pairs"]["llava_onevision"]
    row = written["contexts"]["32"]
    assert row["ar_ms_per_token"] == results["llava_onevision"]["contexts"][32]["ar_ms_per_token"]
    assert "hf_assisted_ms_per_step" not in row and set(row["projection"]) == set(step_costs.POLICIES)
    assert set(written["own_ms_per_step"]) == set(step_costs.POLICIES)


def test_unknown_pairs_are_refused():
    with pytest.raises(SystemExit):
        step_costs.parse_args(["--pairs", "gpt2"])
