"""The synthetic suite, caption scoring and the benchmark harness."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlmspec import SpeculativeVLM
from vlmspec.eval.accuracy import score_caption
from vlmspec.eval.batch_bench import markdown_batch_report, run_batch_bench
from vlmspec.eval.bench import METHODS, autocorrelation, run_bench, write_report
from vlmspec.eval.synthetic import HELD_OUT_BASE, VIDEO_FRAMES, items, make_item
from vlmspec.policies import CALIBRATION_FILE, PathEntropyBins


def test_items_are_deterministic_per_seed():
    a, b = make_item(7), make_item(7)
    assert a.caption == b.caption
    assert np.array_equal(a.video, b.video)


def test_captions_are_long_and_state_the_scene():
    for item in items("train", 6):
        words = len(item.caption.split())
        assert 40 <= words <= 200
        score = score_caption(item, item.caption)
        assert score.count_correct and score.pair_recall == 1.0 and score.pair_precision == 1.0


def test_splits_do_not_overlap_and_alternate_kinds():
    train, held_out = items("train", 4), items("held-out", 4)
    assert all(i.seed < HELD_OUT_BASE <= j.seed for i in train for j in held_out)
    assert [i.kind for i in held_out] == ["image", "video", "image", "video"]
    assert held_out[1].video.shape[0] == VIDEO_FRAMES


def test_videos_show_motion():
    item = next(i for i in items("held-out", 20) if i.kind == "video" and any(s.motion != "still" for s in i.shapes))
    assert not np.array_equal(item.video[0], item.video[-1])


def test_a_wrong_caption_scores_low():
    item = make_item(2)
    wrong = "We see one coloured shapes placed on a grey background. First, a small white circle sits at the top."
    score = score_caption(item, wrong)
    assert not score.count_correct and score.pair_recall == 0.0


def test_autocorrelation_of_a_smooth_series_is_high():
    series = [np.sin(np.linspace(0, 6, 200)) + 2]
    assert autocorrelation(series, max_lag=3)[0] > 0.99


@pytest.fixture
def binned_draft(tmp_path, qwen, monkeypatch):
    """The noisy draft as if loaded from a folder holding heterospec's bins (as `vlmspec calibrate` leaves one)."""
    PathEntropyBins(edges=[0.5, 2.0]).save(tmp_path / "draft" / CALIBRATION_FILE)
    monkeypatch.setattr(qwen.drafts["noisy"].config, "_name_or_path", str(tmp_path / "draft"))
    return qwen.drafts["noisy"]


def test_bench_runs_every_method_on_the_same_inputs(tmp_path, qwen, binned_draft):
    spec = SpeculativeVLM(qwen.target, binned_draft, processor=qwen.processor)
    results = run_bench(spec, "image", list(METHODS), n=2, max_new_tokens=8, progress=False)
    assert list(results["methods"]) == list(METHODS)
    for name, method in results["methods"].items():
        assert method["tokens_per_s"] > 0
        if name != "ar":
            assert method["exact_match"] == 1.0
            assert (method["tau"] is None) == (name == "ar-compiled")
    assert results["methods"]["ar"]["speedup"] == pytest.approx(1.0)
    write_report(results, tmp_path, "vlmspec bench --suite image --n 2")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["methods"]["sage"]) >= {"tau", "tokens_per_s", "speedup", "exact_match"}
    for name in ("results.md", "speedup.png", "tau_distribution.png", "entropy_autocorrelation.png", "sage_steps.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_the_batched_bench_times_every_method_at_every_batch_size_against_plain_generate(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], processor=qwen.processor)
    results = run_batch_bench(spec, "image", ["chain", "sage-gt"], 3, 6, [1, 2], repeats=3, progress=False)
    assert list(results["table"]) == ["generate", "chain", "sage-gt"]
    for cells in results["table"].values():
        for cell in cells.values():
            assert cell["exact_match"] == 1.0
            assert len(cell["runs_seconds"]) == 3
            assert cell["seconds"] == sorted(cell["runs_seconds"])[1]
            assert cell["tokens_per_s"] == pytest.approx(cell["new_tokens"] / cell["seconds"])
    report = markdown_batch_report(results, "vlmspec bench --batch-size 1,2 --repeats 3")
    assert "median of 3 runs" in report
    assert "| chain | " in report and "x) |" in report
    assert results["peers"]["vllm"]["skipped"].startswith("no vLLM environment given (--vllm-python or")
    assert "vLLM peer: skipped (no vLLM environment given" in report


def test_a_compiled_batched_bench_decodes_every_batch_size_once_untimed_and_says_so(qwen, monkeypatch):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], processor=qwen.processor, compile="shapes")
    calls = []
    stream = SpeculativeVLM.stream
    monkeypatch.setattr(
        SpeculativeVLM,
        "stream",
        lambda self, items, batch_size, **kw: calls.append(batch_size) or stream(self, items, batch_size, **kw),
    )
    results = run_batch_bench(spec, "image", ["chain"], 2, 4, [1, 2], progress=False)
    assert results["compiled"] and calls == [2, 1, 1, 2, 2]
    assert results["table"]["chain"][2]["exact_match"] == 1.0
    assert "vlmspec's forwards compiled (each method decoded the items once untimed" in markdown_batch_report(
        results, "vlmspec bench --batch-size 1,2 --compile on"
    )


def test_a_python_without_vllm_is_named_as_the_reason_the_peer_is_skipped():
    import sys

    from vlmspec.eval.vllm_peer import why_not

    assert (
        why_not(sys.executable) == f"{sys.executable} cannot import vllm (ModuleNotFoundError: No module named 'vllm')"
    )
    assert why_not("/no/such/python").startswith("/no/such/python cannot be run: ")


def test_a_failed_peer_run_is_reported_by_its_exception_line():
    from vlmspec.eval.vllm_peer import _last_error

    stderr = (
        "INFO starting\nTraceback (most recent call last):\nValueError: no room\n  For further information visit x\n"
    )
    assert _last_error(stderr) == "ValueError: no room"
    assert _last_error("killed\n") == "killed"


def test_the_batched_report_puts_the_vllm_peer_beside_vlmspec_and_compares_the_best_of_each():
    cell = {"tokens_per_s": 100.0, "seconds": 1.0, "new_tokens": 100, "exact_match": 1.0}
    results = {
        "suite": "image",
        "n": 2,
        "max_new_tokens": 8,
        "machine": "x86_64",
        "device": "cpu",
        "batch_sizes": [1, 4],
        "table": {"generate": {1: cell, 4: {**cell, "tokens_per_s": 200.0}}, "chain": {1: cell, 4: cell}},
        "peers": {
            "vllm": {
                1: {**cell, "tokens_per_s": 50.0, "version": "0.32.0"},
                4: {**cell, "tokens_per_s": 80.0, "exact_match": 0.5, "version": "0.32.0"},
            }
        },
    }
    report = markdown_batch_report(results, "vlmspec bench --batch-size 1,4")
    assert "| vLLM (peer) | 50 | 80, exact 0.50 |" in report
    assert "vLLM 0.32.0, plain decoding: best 80 tok/s; vlmspec's best against it: 1.25x." in report


SAMPLED = {"do_sample": True, "temperature": 1.5, "top_k": 50, "top_p": 0.9}


def test_a_sampled_bench_gives_every_method_the_settings_and_the_same_seed_per_item(
    tmp_path, qwen, binned_draft, monkeypatch
):
    spec = SpeculativeVLM(qwen.target, binned_draft, processor=qwen.processor)
    calls: list[tuple[dict, torch.Tensor]] = []

    def spy(generate):
        def record(*args, **kwargs):
            calls.append(({k: kwargs.get(k) for k in SAMPLED}, torch.get_rng_state()))
            return generate(*args, **kwargs)

        return record

    monkeypatch.setattr(SpeculativeVLM, "generate", spy(SpeculativeVLM.generate))
    monkeypatch.setattr(spec.target, "generate", spy(spec.target.generate))
    n = 2
    results = run_bench(spec, "image", list(METHODS), n=n, max_new_tokens=2, progress=False, generation=SAMPLED)
    assert len(calls) == len(METHODS) * (n + 1)  # a warm-up per method, then every method on each item in turn
    assert all(settings == SAMPLED for settings, _ in calls)
    seeded = [torch.manual_seed(item).get_state() for item in range(n)]
    timed = calls[len(METHODS) :]
    for index, (_, state) in enumerate(timed):
        assert torch.equal(state, seeded[index // len(METHODS)])
    assert all(method["exact_match"] is None for method in results["methods"].values())
    write_report(results, tmp_path, "vlmspec bench --suite image --n 2 --do-sample")
    report = (tmp_path / "results.md").read_text()
    assert "Decoding: sampling (do_sample=True, temperature=1.5, top_k=50, top_p=0.9)" in report
    assert report.count("| n/a |") == len(METHODS)
