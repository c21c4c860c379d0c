"""The serving load bench's bookkeeping, without servers: per-cell figures and the report's ratios."""

from __future__ import annotations

import pytest

from vlmspec.eval.serve_bench import Timed, markdown_fault_report, markdown_serve_report, summarise


def test_a_cell_counts_tokens_latencies_and_exact_answers():
    done = [
        (0, Timed(first=0.1, total=1.1, tokens=11, text="a")),
        (1, Timed(first=0.3, total=0.8, tokens=6, text="wrong")),
        (0, Timed(error="APIError: boom")),
    ]
    cell = summarise(done, 2.0, ["a", "b"])
    assert cell["requests"] == 3 and cell["failed"] == 1 and cell["exact"] == 1
    assert cell["output_tokens_per_s"] == pytest.approx(17 / 2.0) and cell["requests_per_s"] == pytest.approx(1.0)
    assert cell["ttft_p50_ms"] == pytest.approx(200.0) and cell["tpot_p50_ms"] == pytest.approx(100.0)
    assert cell["errors"] == ["APIError: boom"]


def cell(tokens_per_s: float, tpot: float) -> dict:
    return {
        "requests": 8,
        "failed": 0,
        "exact": 8,
        "requests_per_s": 1.0,
        "output_tokens_per_s": tokens_per_s,
        "ttft_p50_ms": 40.0,
        "ttft_p99_ms": 50.0,
        "tpot_p50_ms": tpot,
        "tpot_p99_ms": tpot,
    }


def test_the_report_sets_each_server_against_speculation_off_and_vllm():
    results = {
        "vlmspec serve": {"cells": {"1": cell(200.0, 5.0)}},
        "speculation off": {"cells": {"1": cell(100.0, 10.0)}},
        "vllm serve": {"cells": {"1": cell(80.0, 8.0)}},
        "transformers serve": {"skipped": "no transformers CLI given"},
    }
    meta = {"command": "vlmspec bench-serve", "machine": "cpu", "requests_per_client": 2, "max_tokens": 64, "chats": 5}
    report = markdown_serve_report(results, meta)
    row = next(line for line in report.splitlines() if line.startswith("| vlmspec serve | 1 |"))
    assert "| 2.00x | 0.50x | 2.50x | 0.62x |" in row
    assert "| transformers serve | skipped: no transformers CLI given |" in report


def test_the_fault_report_has_a_row_per_round():
    rounds = [
        {
            "answered": 51,
            "exact": 51,
            "client_errors": 0,
            "health_after": 200,
            "rows_in_flight_after": 0.0,
            "rss_after_mb": 810.0,
        },
    ] * 2
    report = markdown_fault_report({"clients": 64, "left": 7, "malformed": 6, "rss_before_mb": 800.0, "rounds": rounds})
    assert report.count("| 51 | 51 | 0 | 200 | 0 | 810 |") == 2 and "800 MB" in report
