"""`vlmspec bench --batch-size 1,4,...`: many sequences at once, against plain batched `generate` at each batch size.

Every batch size runs the same items in the same process. Plain `generate` decodes them in left-padded batches of B
(as a captioning script would: each batch runs until its longest row ends); vlmspec's methods keep B sequences in
flight with `SpeculativeVLM.stream` (a finished row's slot takes the next item). Tokens per second count each item's
new tokens up to its EOS. Exact match is per item: its ids against plain `generate` at batch size 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tqdm import tqdm

from ..engine.relaxed import RelaxedVerification
from ..engine.stats import SpecStats
from ..speculative import SpeculativeVLM
from .bench import _SPEC_METHODS, machine_description, suite_inputs, suite_items, suite_prompts
from .quality import check_quality_packages, output_quality, quality_lines, relaxed_method
from .vllm_peer import run_vllm_peer, why_not

#: `auto` is the default policy (what a user gets with no policy given).
BATCH_METHODS = ("auto", "chain", "sage", "sage-gt", "heterospec", "confidence")


def new_tokens(row: torch.Tensor, prompt_length: int, eos_token_ids: set[int]) -> torch.Tensor:
    """A sequence's new tokens, up to and including its first EOS (what follows is padding)."""
    new = row[prompt_length:]
    for i, token in enumerate(new.tolist()):
        if token in eos_token_ids:
            return new[: i + 1]
    return new


def run_batch_bench(
    spec: SpeculativeVLM,
    suite: str,
    methods: list[str],
    n: int,
    max_new_tokens: int,
    batch_sizes: list[int],
    repeats: int = 1,
    progress: bool = True,
    vllm_python: str | None = None,
    model: str | None = None,
    verifications: Sequence[RelaxedVerification] = (),
) -> dict[str, Any]:
    """Tokens per second of plain batched `generate` and of each method at every batch size (greedy decoding).

    With `repeats` > 1 every cell is timed that many times, in turns (plain `generate`, then each method, each turn
    starting from the next method, then again), and its tokens per second come from the median time: on a machine
    whose speed drifts by more than the margins measured, one run per cell settles nothing. Every run's ids are
    checked. When the pair runs compiled, each method first decodes the items once untimed at every batch size, so
    no compilation falls in the figures.

    With `vllm_python` (a Python that has vLLM) and `model` (the target's directory), vLLM decodes the same image
    items at every batch size too, as a peer (`peers["vllm"]`); otherwise the peer is recorded as skipped, and why.

    With `verifications` (relaxed rules, lossy) every method also runs under each, in the same turns, and the results
    hold every row's quality at every batch size (`quality`, from each cell's first run) against plain `generate`'s.
    """
    _check_batch_request(methods, repeats)
    if verifications:
        check_quality_packages()
    inputs = suite_inputs(spec.processor, suite, n)
    eos = spec.target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    generation = dict(do_sample=False, max_new_tokens=max_new_tokens)
    runners = _runners(spec, methods, verifications)
    bar = tqdm(
        total=len(batch_sizes) * (1 + len(runners)) * repeats + 1, desc=f"batched bench {suite}", disable=not progress
    )
    _warm_up(spec, runners, inputs, max(batch_sizes), generation)
    bar.update()
    references: list[torch.Tensor] = []
    table: dict[str, dict[int, dict[str, float]]] = {"generate": {}, **{m: {} for m in runners}}
    quality: dict[int, dict[str, dict[str, Any]]] = {}
    for size in batch_sizes:
        made = (spec, runners, inputs, size, repeats, generation, eos_ids, references, bar)
        runs, firsts = _time_batch_size(*made)
        for name, cells in runs.items():
            table[name][size] = _median_cell(cells)
        if verifications:
            quality[size] = _quality(spec, suite, n, firsts)
    bar.close()
    peer = _vllm_peer(
        spec.processor, suite, n, inputs, batch_sizes, max_new_tokens, vllm_python, model, references, eos_ids
    )
    device = spec.target.device
    where = {"machine": machine_description(device), "device": str(device), "compiled": spec.compiled}
    run = {"suite": suite, "n": len(inputs), "max_new_tokens": max_new_tokens, "batch_sizes": batch_sizes}
    return {**run, "repeats": repeats, **where, "table": table, "quality": quality, "peers": {"vllm": peer}}


def _runners(
    spec: SpeculativeVLM, methods: list[str], verifications: Sequence[RelaxedVerification]
) -> dict[str, SpeculativeVLM]:
    """Each method's pair, exact, then under each relaxed rule of `verifications` (`relaxed_method` names them)."""
    runners = {m: spec.with_options(*_SPEC_METHODS[m]) for m in methods}
    for v in verifications:
        runners |= {relaxed_method(m, v): spec.with_options(*_SPEC_METHODS[m], verification=v) for m in methods}
    return runners


def _quality(
    spec: SpeculativeVLM, suite: str, n: int, firsts: dict[str, tuple[list[torch.Tensor], dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Every row's `output_quality` at one batch size from its first run (`firsts`: its rows and cell), against plain
    `generate`'s."""
    items = suite_items(suite, n)
    decode = spec.processor.tokenizer.batch_decode
    references = decode(firsts["generate"][0], skip_special_tokens=True)
    made = {}
    for name, (rows, cell) in firsts.items():
        texts = decode(rows, skip_special_tokens=True)
        made[name] = output_quality(items, texts, references, cell.get("differing_tokens", 0), cell["new_tokens"])
    return made


def _check_batch_request(methods: list[str], repeats: int) -> None:
    """Refuse a batched bench of methods it does not run, or of fewer than one run per cell."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    unknown = [m for m in methods if m not in BATCH_METHODS]
    if unknown:
        raise ValueError(f"unknown methods for a batched bench {unknown}; choose from {', '.join(BATCH_METHODS)}")


def _plain_generate(
    spec: SpeculativeVLM, inputs: list[dict[str, torch.Tensor]], size: int, generation: dict[str, Any]
) -> tuple[list[torch.Tensor], float]:
    """`generate_batches` with the pair's target (its adapter, its tokenizer's padding, its device), and the seconds
    it took."""
    target = spec.target
    adapter = spec._target_runner.adapter
    pad = spec.processor.tokenizer.pad_token_id
    device = target.device
    start = time.perf_counter()
    outputs = generate_batches(target, adapter, inputs, size, pad, device, generation)
    return outputs, time.perf_counter() - start


def _on_device(inputs: list[dict[str, torch.Tensor]], device: torch.device) -> Iterator[tuple[int, dict[str, Any]]]:
    """`stream`'s keyed items, each input moved to `device` as the stream takes it."""
    return ((i, {k: v.to(device) for k, v in item.items()}) for i, item in enumerate(inputs))


def _warm_up(
    spec: SpeculativeVLM,
    runners: dict[str, SpeculativeVLM],
    inputs: list[dict[str, torch.Tensor]],
    size: int,
    generation: dict[str, Any],
) -> None:
    """Warm-up (not timed): one batch of each kind, so first-call costs fall on none of the timed runs."""
    _plain_generate(spec, inputs[:size], size, generation)
    for runner in runners.values():
        list(runner.stream(((i, item) for i, item in enumerate(inputs[:2])), batch_size=2, **generation))


def _time_batch_size(
    spec: SpeculativeVLM,
    runners: dict[str, SpeculativeVLM],
    inputs: list[dict[str, torch.Tensor]],
    size: int,
    repeats: int,
    generation: dict[str, Any],
    eos_ids: set[int],
    references: list[torch.Tensor],
    bar: tqdm,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, list[torch.Tensor]]]:
    """Every timed run at batch size `size`, by method: `repeats` turns of plain `generate` then each method, every
    run's rows checked against `references` (filled by the bench's first run of plain `generate`); and each one's
    first run, its rows and its cell."""
    device = spec.target.device
    runs: dict[str, list[dict[str, float]]] = {"generate": [], **{m: [] for m in runners}}
    firsts: dict[str, tuple[list[torch.Tensor], dict[str, Any]]] = {}
    if spec.compiled:
        for runner in runners.values():
            list(runner.stream(_on_device(inputs, device), batch_size=size, **generation))
    for turn in range(repeats):
        outputs, seconds = _plain_generate(spec, inputs, size, generation)
        rows = [new_tokens(out, item["input_ids"].shape[1], eos_ids) for out, item in zip(outputs, inputs, strict=True)]
        if not references:
            references.extend(rows)
        runs["generate"].append(_cell(rows, references, seconds))
        firsts.setdefault("generate", (rows, runs["generate"][-1]))
        bar.update()
        # Each turn starts the methods from the next one, so no method always runs right after plain `generate`.
        shift = turn % max(len(runners), 1)
        order = list(runners)[shift:] + list(runners)[:shift]
        for method in order:
            items = _on_device(inputs, device)
            start = time.perf_counter()
            results = sorted(runners[method].stream(items, batch_size=size, **generation), key=lambda r: r.key)
            seconds = time.perf_counter() - start
            rows = [r.sequence[0, inputs[r.key]["input_ids"].shape[1] :] for r in results]
            runs[method].append(_cell(rows, references, seconds, [r.stats for r in results]))
            firsts.setdefault(method, (rows, runs[method][-1]))
            bar.update()
    return runs, firsts


def _vllm_peer(
    processor: Any,
    suite: str,
    n: int,
    inputs: list[dict[str, torch.Tensor]],
    batch_sizes: list[int],
    max_new_tokens: int,
    vllm_python: str | None,
    model: str | None,
    references: list[torch.Tensor],
    eos_ids: set[int],
) -> dict[Any, Any]:
    """vLLM's cells on the same image items at every batch size, checked against `references`; or why it was
    skipped (another suite, no vLLM, or the target's directory not known)."""
    if suite != "image":
        return {"skipped": "the vLLM peer decodes the image suite only"}
    if (why := why_not(vllm_python)) is not None or model is None:
        return {"skipped": why or "the target's directory is not known"}
    longest = max(item["input_ids"].shape[1] for item in inputs)
    prompts = suite_prompts(processor, suite, n)
    runs = run_vllm_peer(vllm_python, model, prompts, batch_sizes, max_new_tokens, longest + max_new_tokens)
    return {size: _peer_cell(run, references, eos_ids) for size, run in runs.items()}


def generate_batches(target, adapter, inputs, size, pad, device, generation) -> list[torch.Tensor]:
    """Plain `generate` over `inputs` in left-padded batches of `size`; each item's row, its padding removed."""
    outputs = []
    for start in range(0, len(inputs), size):
        chunk = inputs[start : start + size]
        batch = {k: v.to(device) for k, v in adapter.join_rows(chunk, pad).items()}
        out = target.generate(**batch, **generation)
        width = batch["input_ids"].shape[1]
        for b, item in enumerate(chunk):
            outputs.append(out[b, width - item["input_ids"].shape[1] :])
    return outputs


def _cell(
    rows: list[torch.Tensor], references: list[torch.Tensor], seconds: float, stats: list[SpecStats] | None = None
) -> dict[str, Any]:
    """One run's cell: tokens per second, exact match against `references`; with the rows' `stats` (a vlmspec
    method's), tau over all their drafting steps and the emitted tokens that are not the target's choice."""
    tokens = sum(r.shape[0] for r in rows)
    exact = sum(torch.equal(r.cpu(), ref.cpu()) for r, ref in zip(rows, references, strict=True)) / len(rows)
    cell: dict[str, Any] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "new_tokens": tokens}
    cell["exact_match"] = exact
    if stats:
        drafted = [step.accepted for s in stats for step in s.steps if step.plain is None]
        cell["tau"] = sum(drafted) / max(1, len(drafted))
        cell["differing_tokens"] = sum(s.differing_tokens for s in stats)
        cell["verification"] = next((s.verification for s in stats if s.verification != "exact"), "exact")
    return cell


def _peer_cell(run: dict[str, Any], references: list[torch.Tensor], eos_ids: set[int]) -> dict[str, Any]:
    """A peer's cell from its run: as `_cell` makes one from the new token ids it returned, or the run's `error`."""
    if "error" in run:
        return run
    rows = [new_tokens(torch.tensor(ids, dtype=torch.long), 0, eos_ids) for ids in run["ids"]]
    return {**_cell(rows, references, run["seconds"]), "version": run["version"]}


def _median_cell(runs: list[dict[str, float]]) -> dict[str, Any]:
    """One cell from its runs: the median time's, the lowest exact match of any run, and every run's time."""
    median = sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2]
    return {
        **median,
        "exact_match": min(run["exact_match"] for run in runs),
        "runs_seconds": [run["seconds"] for run in runs],
    }


def markdown_batch_report(results: dict[str, Any], command: str) -> str:
    """Tokens per second per method and batch size, with the ratio to plain `generate` at the same batch size."""
    sizes = results["batch_sizes"]
    table = results["table"]
    lines = [
        f"Suite `{results['suite']}`: {results['n']} held-out items, up to {results['max_new_tokens']} new tokens, "
        f"greedy; {results['machine']}; device {results['device']}"
        + (
            "; vlmspec's forwards compiled (each method decoded the items once untimed at every batch size first)."
            if results.get("compiled")
            else "."
        ),
        "",
        f"Command: `{command}`",
        "",
        "Tokens/s"
        + ("" if results.get("repeats", 1) == 1 else f", median of {results['repeats']} runs taken in turns")
        + " (ratio to plain `generate` at the same batch size; exact match per item against batch-1 `generate`):",
        "",
        "| method | " + " | ".join(f"B={b}" for b in sizes) + " |",
        "| --- |" + " --- |" * len(sizes),
    ]
    plain = table["generate"]
    for method, cells in table.items():
        row = []
        for b in sizes:
            cell = cells[b]
            ratio = "" if method == "generate" else f" ({cell['tokens_per_s'] / plain[b]['tokens_per_s']:.2f}x)"
            tau = f", tau {cell['tau']:.2f}" if results.get("quality") and "tau" in cell else ""
            row.append(f"{cell['tokens_per_s']:.0f}{ratio}{tau}{_exact_note(cell)}")
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    peer = results.get("peers", {}).get("vllm", {"skipped": "not run"})
    if "skipped" not in peer:
        cells = [peer[b] for b in sizes]
        row = [
            cell["error"] if "error" in cell else f"{cell['tokens_per_s']:.0f}" + _exact_note(cell) for cell in cells
        ]
        lines.append("| vLLM (peer) | " + " | ".join(row) + " |")
    best_plain = max(c["tokens_per_s"] for c in plain.values())
    exact = [c for m, cells in table.items() if m != "generate" for c in cells.values() if "relaxed" not in m]
    best = max(c["tokens_per_s"] for c in exact)
    lines += [
        "",
        f"Best vlmspec {best:.0f} tok/s against best plain `generate` {best_plain:.0f} tok/s: "
        f"{best / best_plain:.2f}x.",
    ]
    for size, quality in results.get("quality", {}).items():
        lines += [f"At B={size}:", *quality_lines(quality)[1:], ""]
    if "skipped" in peer:
        lines.append(f"vLLM peer: skipped ({peer['skipped']}).")
    else:
        rates = [cell["tokens_per_s"] for cell in peer.values() if "tokens_per_s" in cell]
        versions = {cell["version"] for cell in peer.values() if "version" in cell}
        if rates:
            lines.append(
                f"vLLM {', '.join(sorted(versions))}, plain decoding: best {max(rates):.0f} tok/s; vlmspec's best "
                f"against it: {best / max(rates):.2f}x."
            )
    return "\n".join(lines + [""])


def _exact_note(cell: dict[str, Any]) -> str:
    """A cell's exact match where it is not whole; for a relaxed method, "relaxed" and its tokens that differ."""
    if cell.get("verification", "exact") != "exact":
        return f", relaxed: exact {cell['exact_match']:.2f}, {cell['differing_tokens']} tokens differ"
    return "" if cell["exact_match"] == 1.0 else f", exact {cell['exact_match']:.2f}"
