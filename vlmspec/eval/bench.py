"""`vlmspec bench`: every method on the same inputs in one process, against plain `generate`.

Methods: `ar` (target.generate), `ar-compiled` (target.generate with a static cache, compiled by `torch.compile` through
transformers' `compile_config`, on any device; its first call's compilation falls in the warm-up), `hf-assisted`
(target.generate with the draft as `assistant_model`), `chain`,
`static-tree`, `specvlm` (verifier pruning + static tree), `sage` (verifier pruning + SAGE), `sage-gt` (verifier
pruning + SAGE sized by measured cost), and `sage-full` / `sage-gt-full`, the same without pruning (the draft sees
every visual token). When the pair runs compiled, every padded size is compiled first (`SpeculativeVLM.warm_up`
on the longest item); each method is then warmed up on the first item (`warm_up_seconds` records both) and starts
afresh (a new policy, which learns across calls); then every item is run by every method in turn,
so a change in the machine's speed during the run falls on all methods alike. All use the same generation
settings, greedy unless they sample; every call on item i starts from `torch.manual_seed(i)`, so a sampled run
repeats. Speedup is tokens per second relative to `ar` in the same run; exact_match the share of items whose ids
equal `ar`'s, None when sampling (every method draws its own sample from the same distribution).

Suites: `image` and `video` are the demo pair's held-out items at its training size (112 px, 8-frame clips);
`long-video` renders the held-out clips with 32 frames at 336 px, which the Qwen-VL video processors' default
pixel budget (at least 128 x 28 x 28 pixels per frame) keeps whole: 2,304 visual tokens per clip.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import CompileConfig, PreTrainedModel

from ..engine.relaxed import RelaxedVerification, refuse_sampling
from ..engine.stats import PHASES
from ..processors import QwenVideoPacker, VisualInputs, chat_messages
from ..speculative import SpeculativeVLM
from .quality import check_quality_packages, output_quality, quality_lines, relaxed_method
from .synthetic import VIDEO_FPS, Item, items, make_item

SUITES = ("image", "video", "long-video")
LONG_VIDEO_FRAMES = 32
LONG_VIDEO_SIZE = 336

METHODS = (
    "ar",
    "ar-compiled",
    "hf-assisted",
    "auto",
    "chain",
    "static-tree",
    "specvlm",
    "sage",
    "sage-gt",
    "heterospec",
    "confidence",
    "sage-full",
    "sage-gt-full",
)
_SPEC_METHODS = {
    "auto": ("auto", "auto"),
    "chain": ("chain", None),
    "static-tree": ("static-tree", None),
    "specvlm": ("static-tree", "verifier"),
    "sage": ("sage", "verifier"),
    "sage-gt": ("sage-gt", "verifier"),
    "heterospec": ("heterospec", "verifier"),
    "confidence": ("confidence", "verifier"),
    "sage-full": ("sage", None),
    "sage-gt-full": ("sage-gt", None),
}


@dataclass
class MethodRun:
    """What one method did over the suite."""

    seconds: float = 0.0
    new_tokens: int = 0
    taus: list[float] = field(default_factory=list)
    exact: list[bool] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: list[list[dict[str, Any]]] = field(default_factory=list)
    prefill_tokens: list[tuple[int, int]] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    differing: int = 0
    verification: str = "exact"

    def summary(self, ar_tokens_per_s: float) -> dict[str, Any]:
        tokens_per_s = self.new_tokens / self.seconds if self.seconds else 0.0
        target, draft = np.mean(self.prefill_tokens, axis=0) if self.prefill_tokens else (None, None)
        steps = [step for item in self.steps for step in item]
        reasons: dict[str, int] = {}
        for step in steps:
            if step.get("plain") is not None:
                reasons[step["plain"]] = reasons.get(step["plain"], 0) + 1
        return {
            "tau": float(np.mean(self.taus)) if self.taus else None,
            "tokens_per_s": tokens_per_s,
            "speedup": tokens_per_s / ar_tokens_per_s if ar_tokens_per_s else None,
            "exact_match": float(np.mean(self.exact)) if self.exact else None,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "target_prefill_tokens": None if target is None else float(target),
            "draft_prefill_tokens": None if draft is None else float(draft),
            "phase_seconds": self.phase_seconds if any(self.phase_seconds.values()) else None,
            "steps": len(steps) if self.steps else None,
            "plain_steps": sum(reasons.values()),
            "plain_reasons": reasons,
            "verification": self.verification,
            "differing_tokens": self.differing,
        }


class ForwardCounter:
    """Counts a model's forward calls (HF assisted generation reports no acceptance; this recovers it)."""

    def __init__(self, model: torch.nn.Module):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1


def long_video_processor(processor: Any) -> Any:
    """`processor` with the Qwen-VL video processors' default pixel budget where its own packer narrows it (the demo
    pair's processor fixes 112 x 112 frames); a processor that handles videos itself is used as it is."""
    packer = getattr(processor, "video_packer", None)
    if not isinstance(packer, QwenVideoPacker):
        return processor
    defaults = type(packer.patcher)()
    patcher = replace(packer.patcher, min_pixels=defaults.min_pixels, max_pixels=defaults.max_pixels)
    return VisualInputs(processor.processor, QwenVideoPacker(patcher, packer.timestamps, packer.sampling))


def suite_items(suite: str, n: int) -> list[Item]:
    """The first `n` held-out items of one suite (`long-video`: the video suite's clips rendered long), so that every
    benchmark and the demo pair's training score the same items."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    kind = "image" if suite == "image" else "video"
    chosen = [i for i in items("held-out", 4 * n + 2) if i.kind == kind][:n]
    if suite == "long-video":
        chosen = [make_item(i.seed, "video", LONG_VIDEO_FRAMES, LONG_VIDEO_SIZE) for i in chosen]
    return chosen


def suite_prompts(processor, suite: str, n: int) -> list[tuple[str, list[Any], list[Any]]]:
    """Held-out items of one suite as the processor's chat text, images and videos of each."""
    prompts = []
    for item in suite_items(suite, n):
        images, videos = ([item.image], []) if item.kind == "image" else ([], [item.video])
        prompts.append(
            (processor.apply_chat_template(chat_messages(item.prompt, len(images), len(videos))), images, videos)
        )
    return prompts


def suite_inputs(processor, suite: str, n: int) -> list[dict[str, torch.Tensor]]:
    """Processed held-out items of one suite."""
    if suite == "long-video":
        processor = long_video_processor(processor)
    return [
        dict(processor(text, images=images, videos=videos, video_fps=VIDEO_FPS))
        for text, images, videos in suite_prompts(processor, suite, n)
    ]


def synthetic_inputs(processor, item: Item) -> dict[str, torch.Tensor]:
    """One synthetic item processed as the suites' items are."""
    images, videos = ([item.image], []) if item.kind == "image" else ([], [item.video])
    text = processor.apply_chat_template(chat_messages(item.prompt, len(images), len(videos)))
    return dict(processor(text, images=images, videos=videos, video_fps=VIDEO_FPS))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer read after it counts that work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_description(device: torch.device) -> str:
    """What the figures ran on: the GPU's name on CUDA, else the CPU's architecture and torch's threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def top_k_entropy(scores: tuple[torch.Tensor, ...], k: int = 10) -> np.ndarray:
    """Per generated token, the entropy of the target's renormalised top-k distribution."""
    values = []
    for step in scores:
        p = torch.softmax(step[0].float().topk(k).values, dim=-1)
        values.append(float(-(p * p.clamp_min(1e-30).log()).sum()))
    return np.array(values)


def autocorrelation(series: list[np.ndarray], max_lag: int = 10) -> list[float]:
    """Pearson correlation of entropy at step t and t + lag, pooled over items, for lags 1..max_lag."""
    out = []
    for lag in range(1, max_lag + 1):
        a = np.concatenate([s[:-lag] for s in series if len(s) > lag] or [np.zeros(0)])
        b = np.concatenate([s[lag:] for s in series if len(s) > lag] or [np.zeros(0)])
        out.append(float(np.corrcoef(a, b)[0, 1]) if len(a) > 2 and a.std() > 0 and b.std() > 0 else math.nan)
    return out


def run_bench(
    spec: SpeculativeVLM,
    suite: str,
    methods: list[str],
    n: int,
    max_new_tokens: int,
    progress: bool = True,
    generation: dict[str, Any] | None = None,
    verifications: Sequence[RelaxedVerification] = (),
) -> dict[str, Any]:
    """Run every method on the same `n` items; returns the results (also the plots' data).

    `generation` holds settings for every method's generate (e.g. `repetition_penalty`, or `do_sample=True` with
    `temperature`, `top_k`, `top_p`); decoding is greedy unless it sets `do_sample`. With `verifications` (relaxed
    rules, lossy, greedy only) every vlmspec method also runs under each, in the same turns, and the results hold
    every method's quality (`quality.output_quality`) beside its speed.
    """
    generation = dict(generation or {})
    sampling = bool(generation.get("do_sample"))
    variants = _variants(methods, verifications, sampling)
    methods = list(variants)
    target = spec.target
    device = target.get_input_embeddings().weight.device
    inputs = [{k: v.to(device) for k, v in item.items()} for item in suite_inputs(spec.processor, suite, n)]
    runs = {m: MethodRun() for m in methods}
    runners = {m: _Runner(spec, *variants[m], generation) for m in methods}
    longest = max(inputs, key=lambda item: item["input_ids"].shape[1])
    warm_up = {"compile": spec.warm_up(max_new_tokens, **longest)} if spec.compiled else {}
    bar = tqdm(total=len(methods) * (len(inputs) + 1), desc=f"bench {suite}", disable=not progress)
    warm_up.update(_first_calls(methods, runners, inputs[0], max_new_tokens, bar))
    # Every method starts the timed items afresh (policies learn across calls; compiled graphs are kept).
    runners = {m: _Runner(spec, *variants[m], generation) for m in methods}
    entropies = _time_items(runners, runs, inputs, max_new_tokens, sampling, target, device, bar)
    bar.close()
    ar_rate = runs["ar"].new_tokens / runs["ar"].seconds
    quality = _quality(spec, runs, suite, n) if verifications else None
    return {
        "quality": quality,
        "suite": suite,
        "n": len(inputs),
        "max_new_tokens": max_new_tokens,
        "generation": generation,
        "sampling": sampling,
        "machine": machine_description(device),
        "device": str(device),
        "compiled": spec.compiled,
        "warm_up_seconds": warm_up,
        "methods": {m: runs[m].summary(ar_rate) for m in methods},
        "tau_per_item": {m: runs[m].taus for m in methods if runs[m].taus},
        "entropy_autocorrelation": autocorrelation(entropies),
        "sage_steps": runs["sage"].steps[0] if "sage" in runs and runs["sage"].steps else [],
        "cost_model_steps": {
            m: [s for item_steps in runs[m].steps for s in item_steps if s["predicted_tokens"] is not None]
            for m in methods
            if m.startswith("sage-gt")
        },
    }


def _variants(
    methods: list[str], verifications: Sequence[RelaxedVerification], sampling: bool
) -> dict[str, tuple[str, RelaxedVerification | None]]:
    """Every row of the bench by name: `ar` first, then each method exact, then each vlmspec method under each relaxed
    rule (`relaxed_method`), with its method and rule; unknown methods, and relaxed rules where the bench samples or
    the quality packages are missing, refused."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if verifications:
        check_quality_packages()
        refuse_sampling(verifications[0], sampling)
    methods = ["ar"] + [m for m in methods if m != "ar"]
    variants: dict[str, tuple[str, RelaxedVerification | None]] = {m: (m, None) for m in methods}
    variants |= {relaxed_method(m, v): (m, v) for m in methods if m in _SPEC_METHODS for v in verifications}
    return variants


def _quality(spec: SpeculativeVLM, runs: dict[str, MethodRun], suite: str, n: int) -> dict[str, dict[str, Any]]:
    """Every method's `output_quality` over the suite's items, against `ar`'s outputs (the target's own)."""
    items = suite_items(suite, n)
    decode = spec.processor.tokenizer.batch_decode
    references = decode(runs["ar"].outputs, skip_special_tokens=True)
    return {
        name: output_quality(
            items, decode(run.outputs, skip_special_tokens=True), references, run.differing, run.new_tokens
        )
        for name, run in runs.items()
    }


def _first_calls(
    methods: list[str], runners: dict[str, _Runner], item: dict[str, torch.Tensor], max_new_tokens: int, bar: tqdm
) -> dict[str, float]:
    """Each method's first call on `item`, kept out of the timed items: its seconds (first-call costs, compilation
    included)."""
    seconds: dict[str, float] = {}
    for method in methods:
        start = time.perf_counter()
        runners[method](item, max_new_tokens)
        bar.update()
        seconds[method] = time.perf_counter() - start
    return seconds


def _time_items(
    runners: dict[str, _Runner],
    runs: dict[str, MethodRun],
    inputs: list[dict[str, torch.Tensor]],
    max_new_tokens: int,
    sampling: bool,
    target: torch.nn.Module,
    device: torch.device,
    bar: tqdm,
) -> list[np.ndarray]:
    """Every method on every item in turn, seeded by the item's index, recorded into `runs`: time, new tokens, exact
    match against ar's ids (greedy only) and acceptance. Returns ar's top-k entropies, one array per item."""
    references: list[torch.Tensor] = []
    entropies: list[np.ndarray] = []
    for index, item in enumerate(inputs):
        for method, runner in runners.items():
            torch.manual_seed(index)
            counter = ForwardCounter(target) if method == "hf-assisted" else None
            synchronize(device)
            start = time.perf_counter()
            ids, scores = runner(item, max_new_tokens)
            synchronize(device)
            seconds = time.perf_counter() - start
            if counter is not None:
                counter.handle.remove()
            new = ids.shape[1] - item["input_ids"].shape[1]
            run = runs[method]
            run.outputs.append(ids[0, item["input_ids"].shape[1] :].cpu())
            run.seconds += seconds
            run.new_tokens += new
            if method == "ar":
                references.append(ids)
                entropies.append(top_k_entropy(scores))
            elif not sampling:
                run.exact.append(bool(torch.equal(ids, references[index])))
            _record_acceptance(run, runner, new, counter)
            bar.update()
    return entropies


def _record_acceptance(run: MethodRun, runner: _Runner, new: int, counter: ForwardCounter | None) -> None:
    """One item's tau into `run`: hf-assisted's from the target forwards `counter` counted; vlmspec's from its stats,
    with its prefill sizes, phase times and steps."""
    if counter is not None:
        run.taus.append((new - counter.calls) / max(1, counter.calls))
    elif runner.spec is not None:
        stats = runner.spec.last_stats
        run.taus.append(stats.mean_accept_length)
        run.differing += stats.differing_tokens
        run.verification = stats.verification
        run.prefill_tokens.append((stats.target_prefill_tokens, stats.draft_prefill_tokens))
        for phase, value in stats.phase_seconds.items():
            run.phase_seconds[phase] += value
        run.steps.append([vars(s) for s in stats.steps])


class _Runner:
    """Uniform call for a method: (inputs, max_new_tokens) -> (ids, scores or None)."""

    def __init__(
        self,
        spec: SpeculativeVLM,
        method: str,
        verification: RelaxedVerification | None,
        generation: dict[str, Any],
    ):
        self.method = method
        self.generation = {"do_sample": False, **generation}
        self.target, self.draft = spec.target, spec.draft
        self.spec = None
        if method == "hf-assisted" and not isinstance(spec.draft, PreTrainedModel):
            raise ValueError(
                "hf-assisted drafts with a whole VLM (transformers' assistant_model runs no draft head): leave it out "
                "of --methods when --draft is a head"
            )
        if method in _SPEC_METHODS:
            policy, pruning = _SPEC_METHODS[method]
            self.spec = spec.with_options(policy, pruning, verification=verification or "exact")

    @torch.inference_mode()
    def __call__(self, inputs: dict[str, torch.Tensor], max_new_tokens: int):
        if self.spec is not None:
            return self.spec.generate(**inputs, max_new_tokens=max_new_tokens, **self.generation), None
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, **self.generation)
        if self.method == "hf-assisted":
            out = self.target.generate(**inputs, assistant_model=self.draft, **kwargs)
            return out, None
        if self.method == "ar-compiled":
            out = self.target.generate(
                **inputs, cache_implementation="static", compile_config=compiled_generate_config(), **kwargs
            )
            return out, None
        out = self.target.generate(**inputs, output_scores=True, return_dict_in_generate=True, **kwargs)
        return out.sequences, out.scores


def compiled_generate_config() -> CompileConfig:
    """`generate`'s compilation of its decoding forward, on every device (by default it compiles on accelerators
    only)."""
    config = CompileConfig(fullgraph=True)
    config._compile_all_devices = True
    return config


def exact_match_cell(results: dict[str, Any], method: str) -> str:
    """A method's exact-match share as reported: "n/a" when sampling, "-" for `ar` itself, "relaxed" and the tokens
    that differ from the target's choice for a method decoded under relaxed verification."""
    if results["sampling"]:
        return "n/a"
    own = results["methods"][method]
    if own.get("verification", "exact") != "exact":
        return f"relaxed, {own['exact_match']:.2f} ({own['differing_tokens']} tokens differ)"
    share = own["exact_match"]
    return "-" if share is None else f"{share:.2f}"


def decoding_line(results: dict[str, Any]) -> str:
    """How the run decoded: greedy, or sampling with its settings and seeds (and why exact match does not apply)."""
    settings = ", ".join(f"{k}={v}" for k, v in results["generation"].items())
    if not results["sampling"]:
        return "Decoding: greedy" + (f" ({settings})." if settings else ".")
    return (
        f"Decoding: sampling ({settings}); every method starts item i from `torch.manual_seed(i)`. Exact match "
        "against ar is n/a: each method draws its own sample from the target's distribution."
    )


def compile_line(results: dict[str, Any]) -> str:
    """Whether vlmspec's forwards ran compiled, and what warming up (compiling every padded size) took."""
    warm = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in results.get("warm_up_seconds", {}).items())
    if not results.get("compiled"):
        return f"vlmspec's forwards: eager. Warm-up (first item, not timed): {warm}."
    return (
        "vlmspec's forwards: compiled (every padded size compiled before timing, so compilation stays out of the "
        f"figures). Warm-up, not timed: {warm}."
    )


def markdown_report(results: dict[str, Any], command: str) -> str:
    """The results as markdown: the main table and the phase breakdown (as SAGE's Table 6)."""
    lines = [
        f"Suite `{results['suite']}`: {results['n']} held-out items, up to {results['max_new_tokens']} new tokens; "
        f"{results['machine']}.",
        "",
        decoding_line(results),
        "",
        compile_line(results),
        "",
        f"Command: `{command}`",
        "",
        "| method | tau | tokens/s | speedup vs ar | exact match | draft prefill tokens | steps that ran plain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in results["methods"].items():
        tau = "-" if m["tau"] is None else f"{m['tau']:.2f}"
        draft = m.get("draft_prefill_tokens")
        prefill = "-" if draft is None else f"{draft:.0f} of {m['target_prefill_tokens']:.0f}"
        lines.append(
            f"| {name} | {tau} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x | {exact_match_cell(results, name)} "
            f"| {prefill} | {plain_cell(m)} |"
        )
    lines += [
        "",
        "Share of wall time per phase:",
        "",
        "| method | " + " | ".join(PHASES) + " |",
        "| --- |" + " --- |" * len(PHASES),
    ]
    for name, m in results["methods"].items():
        if m["phase_seconds"]:
            total = sum(m["phase_seconds"].values())
            lines.append(
                f"| {name} | " + " | ".join(f"{100 * m['phase_seconds'][p] / total:.1f}%" for p in PHASES) + " |"
            )
    if results.get("quality"):
        lines += quality_lines(results["quality"])
    lines += cost_model_lines(results.get("cost_model_steps", {}))
    lags = ", ".join(f"{v:.2f}" for v in results["entropy_autocorrelation"])
    lines += ["", f"Autocorrelation of the target's top-10 entropy at lags 1-10: {lags}.", ""]
    return "\n".join(lines)


def plain_cell(method: dict[str, Any]) -> str:
    """How many of a method's steps ran plain (no draft), of all its steps, and why."""
    if not method.get("steps"):
        return "-"
    why = "; ".join(f"{reason}: {count}" for reason, count in method.get("plain_reasons", {}).items())
    return f"{method['plain_steps']} of {method['steps']}" + (f" ({why})" if why else "")


def cost_model_lines(steps_by_method: dict[str, list[dict[str, Any]]]) -> list[str]:
    """How well the cost-aware policy predicted its steps: tokens emitted and drafting + verification seconds."""
    rows = []
    for name, steps in steps_by_method.items():
        if not steps:
            continue
        predicted = np.array([[s["predicted_tokens"], s["predicted_seconds"]] for s in steps])
        observed = np.array([[s["accepted"] + 1, s["seconds"]] for s in steps])
        error = np.abs(predicted - observed).mean(axis=0)
        rows.append(
            f"| {name} | {len(steps)} | {predicted[:, 0].mean():.2f} / {observed[:, 0].mean():.2f} | {error[0]:.2f} "
            f"| {1000 * predicted[:, 1].mean():.1f} / {1000 * observed[:, 1].mean():.1f} | {1000 * error[1]:.1f} |"
        )
    if not rows:
        return []
    return [
        "",
        "Cost model, predicted before each step against what happened (steps after warm-up; seconds are drafting + "
        "verification):",
        "",
        "| method | steps | tokens per step, predicted / observed | mean abs error | ms per step, predicted / "
        "observed | mean abs error (ms) |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
    ]


def write_report(results: dict[str, Any], out: Path, command: str) -> None:
    """results.json, results.md and the PNG plots."""
    from .plots import plot_all

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown_report(results, command))
    plot_all(results, out)
