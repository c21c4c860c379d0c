"""`vlmspec profile`: what a decoding step asks of a GPU, counted on any device.

Two counts, per step and per emitted token, for each policy beside plain `generate`:
- kernel launches: the aten operators that run a kernel (views, metadata and bare allocations excluded), split
  into those inside the target's forward, inside the draft's forward, and the rest (the decoder's own work);
- host reads: the calls that make a GPU's host wait for the device: `item`, `bool`/`int`/`float`/`index` of a
  tensor, `tolist`, `cpu`, `numpy`, `nonzero`, `masked_select`, `unique`, `argwhere`, indexing with a boolean
  mask, and (on an accelerator) copies of host values to the device that block (`torch.tensor(values,
  device="cuda")`; the engine copies such values from pinned memory without blocking).
A step's counts are those of a call with `max_new_tokens=N` less those of a call with 2 (both prefills and the
first step), divided by the steps in between, so prompt processing is left out. SAGE's trees are grown as on an
accelerator (`SageConfig(fixed_shapes=True)`), whatever device runs the count. With a batch size B, B copies of the
prompt decode together (plain `generate` on the padded batch, vlmspec through `stream`): a step is then one step of
the whole batch, and its tokens those of all rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ..policies import AutoPolicy, HeteroSpecConfig, SageConfig, SageGtConfig
from ..policies.draft_gate import DraftGateConfig
from ..speculative import SpeculativeVLM
from .trace_counts import TraceCounts, per_step, traced

POLICIES = ("chain", "static-tree", "sage", "sage-gt", "heterospec", "confidence", "plain")
#: The policies as an accelerator runs them; `plain` is the default policy where drafting never pays: every step a
#: plain one (the target's next token alone), what a step costs once the default stops drafting.
_ON_ACCELERATORS = {
    "sage": lambda: SageConfig(fixed_shapes=True),
    "sage-gt": lambda: SageGtConfig(sage=SageConfig(fixed_shapes=True)),
    "heterospec": lambda: HeteroSpecConfig(sage=SageConfig(fixed_shapes=True)),
    "plain": lambda: AutoPolicy(gate=DraftGateConfig(cost_ratio=1e9, prior_tokens=1.0, longest_run=1 << 30)),
}
#: Qwen2.5-VL-Instruct's released sampling settings (its generation_config.json).
QWEN2_5_VL_RELEASED = dict(do_sample=True, top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05)
CONFIGS = {"greedy": dict(do_sample=False), "qwen2.5-vl released": QWEN2_5_VL_RELEASED}


class NoImmediateRepeat(LogitsProcessor):
    """A caller's own logits processor, as `generate`'s `logits_processor` takes one: no token right after itself
    (a pure function of each row's last token, one kernel)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.scatter(1, input_ids[:, -1:], -torch.inf)


class EndsWithToken(StoppingCriteria):
    """A caller's own stopping criterion, as `generate`'s `stopping_criteria` takes one, written in Python: whether
    each row's last token is `token` (-1, the default, never is)."""

    def __init__(self, token: int = -1):
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return input_ids[:, -1] == self.token


#: Configs that also pass `generate` arguments beyond the generation config (`--configs`), to measure what they
#: cost: stop strings (checked on the device), a Python stopping criterion (called once per emitted token) and a
#: custom processor (run at every tree node).
ARGUMENT_CONFIGS = {
    "greedy + stop strings": dict(do_sample=False, stop_strings=["###", "</answer>"]),
    "greedy + Python criterion": dict(do_sample=False, stopping_criteria=StoppingCriteriaList([EndsWithToken()])),
    "greedy + custom processor": dict(do_sample=False, logits_processor=LogitsProcessorList([NoImmediateRepeat()])),
}


def config_settings(config: str, tokenizer: Any) -> dict[str, Any]:
    """The `generate` arguments of `config` (stop strings with the `tokenizer` they need)."""
    settings = dict(CONFIGS.get(config) or ARGUMENT_CONFIGS[config])
    if "stop_strings" in settings:
        settings["tokenizer"] = tokenizer
    return settings


_READ_CALLS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"}
_READ_FUNCTIONS = {"nonzero", "masked_select", "unique", "argwhere", "unique_consecutive"}
_INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}
_NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh"}
#: Operators that copy a value to the host: a read even where no Python call asked for one (indexing with a 0-d
#: tensor reads its value inside the indexing code).
_SCALAR_READS = {"item", "_local_scalar_dense"}
SCOPES = ("target", "draft", "own")
_COPIES = {"_to_copy", "copy_"}


def _waits_for_device(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a copy moves host values to an accelerator and waits for it: a blocking host-to-device copy (as
    `torch.tensor(values, device="cuda")` makes) first waits for every queued kernel, as a read does."""
    if kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
        return False
    source = args[1] if name == "copy_" else args[0]
    target = args[0].device if name == "copy_" else kwargs.get("device")
    return (
        isinstance(source, torch.Tensor)
        and source.device.type == "cpu"
        and target is not None
        and torch.device(target).type != "cpu"
    )


def _is_bool_mask(index: Any) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class _Reads(TorchFunctionMode):
    """Counts host reads at the Python level, where `tolist` and `cpu` are seen even on a CPU run."""

    def __init__(self, counter: LaunchCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        read = name in _READ_CALLS or name in _READ_FUNCTIONS
        read |= name in _INDEXING and len(args) > 1 and _is_bool_mask(args[1])
        if not read:
            return func(*args, **(kwargs or {}))
        self.counter.reads[self.counter.scope] += 1
        self.counter.reading += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counter.reading -= 1


class _Launches(TorchDispatchMode):
    """Counts the aten operators that run a kernel."""

    def __init__(self, counter: LaunchCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _SCALAR_READS or (name in _COPIES and _waits_for_device(name, args, kwargs or {})):
            if not self.counter.reading:
                self.counter.reads[self.counter.scope] += 1
        elif not func.is_view and name not in _NO_KERNEL:
            self.counter.launches[self.counter.scope] += 1
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Counts launches and host reads while active, attributed to the target's forward, the draft's, or neither."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None = None):
        self.launches: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.forwards: Counter[str] = Counter()
        self.reading = 0
        self._stack: list[str] = []
        self._handles = []
        for scope, model in (("target", target), ("draft", draft)):
            if model is None or (scope == "draft" and model is target):
                continue
            self._handles.append(model.register_forward_pre_hook(lambda *_, s=scope: self._enter(s)))
            self._handles.append(model.register_forward_hook(self._leave))

    def _enter(self, scope: str) -> None:
        self._stack.append(scope)
        self.forwards[scope] += 1

    def _leave(self, *_) -> None:
        self._stack.pop()

    @property
    def scope(self) -> str:
        return self._stack[-1] if self._stack else "own"

    @contextmanager
    def counting(self) -> Iterator[LaunchCounter]:
        """Count inside the block (the counts start from zero)."""
        self.launches.clear()
        self.reads.clear()
        self.forwards.clear()
        with _Reads(self), _Launches(self):
            yield self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Profile:
    """One method's counts per step and per emitted token (launches by scope, host reads outside and inside the
    models' forwards, and the forwards of each model: a draft's are its step's first forward and its tree levels)."""

    method: str
    config: str
    steps: float
    tokens: float
    launches: dict[str, float]
    reads: dict[str, float]
    traced: TraceCounts | None = None
    forwards: dict[str, float] | None = None

    @property
    def draft_launches_per_forward(self) -> float | None:
        """What one draft forward (a tree level) launches, where the draft ran any."""
        if not self.forwards or not self.forwards["draft"]:
            return None
        return self.launches["draft"] / self.forwards["draft"]

    def per(self, unit: str) -> dict[str, float]:
        n = max(self.steps if unit == "step" else self.tokens, 1e-9)
        counts = {f"{s} launches": self.launches[s] / n for s in SCOPES}
        counts["own reads"] = self.reads["own"] / n
        counts["reads in forwards"] = (self.reads["target"] + self.reads["draft"]) / n
        return counts


def _difference(counter: LaunchCounter, run, new_tokens: int) -> tuple[Counter, Counter, Counter, tuple[float, float]]:
    """Launches, reads and forwards of `run(new_tokens)` less those of `run(2)`, and the (steps, tokens) between them,
    after an uncounted
    `run(new_tokens)`: what is made once per process (a tree shape and its masks, first needed at a step the short
    call never drafts) is not charged to the steps. `run(n)` returns the steps and tokens of its call."""
    run(new_tokens)
    with counter.counting():
        short = run(2)
    launches, reads, forwards = Counter(counter.launches), Counter(counter.reads), Counter(counter.forwards)
    with counter.counting():
        long = run(new_tokens)
    steps = (long[0] - short[0], long[1] - short[1])
    return counter.launches - launches, counter.reads - reads, counter.forwards - forwards, steps


def profile_generate(
    target: torch.nn.Module, inputs: dict, new_tokens: int, config: str, tokenizer: Any = None
) -> Profile:
    """Plain `generate`'s counts per step (a step emits a token in every row of `inputs`, one prompt or a batch)."""
    counter = LaunchCounter(target)
    settings = config_settings(config, tokenizer)
    prompt, batch_size = inputs["input_ids"].shape[1], inputs["input_ids"].shape[0]

    def run(n: int) -> tuple[int, int]:
        steps = target.generate(**inputs, max_new_tokens=n, **settings).shape[1] - prompt
        return steps, steps * batch_size

    try:
        launches, reads, forwards, (steps, tokens) = _difference(counter, run, new_tokens)
    finally:
        counter.remove()
    name = _named("generate", batch_size)
    return Profile(name, config, steps, tokens, _full(launches), _full(reads), forwards=_full(forwards))


def profile_policy(
    spec: SpeculativeVLM, policy: str, inputs: dict, new_tokens: int, config: str, batch_size: int = 1
) -> Profile:
    """Counts of `spec` with `policy` per decoding step and per emitted token: launches and reads where `spec` runs
    eager, compiled regions, operators outside them, reads and graphs compiled after warm-up (`trace_counts`) where it
    runs compiled."""
    chosen = _ON_ACCELERATORS[policy]() if policy in _ON_ACCELERATORS else policy
    runner = spec.with_options(chosen, pruning=None, verification=spec.verification)
    settings = config_settings(config, None if spec.processor is None else spec.processor.tokenizer)
    run = _policy_run(runner, inputs, settings, batch_size)
    name = _named(policy, batch_size)
    if spec.compiled:
        runner.warm_up(new_tokens, batch_size, generation=settings, **inputs)
        traced, (steps, tokens) = _traced_difference(run, new_tokens)
        empty = _full(Counter())
        return Profile(name, config, steps, tokens, empty, empty, traced)
    counter = LaunchCounter(spec.target, spec.draft)
    try:
        launches, reads, forwards, (steps, tokens) = _difference(counter, run, new_tokens)
    finally:
        counter.remove()
    return Profile(name, config, steps, tokens, _full(launches), _full(reads), forwards=_full(forwards))


def _policy_run(runner: SpeculativeVLM, inputs: dict, settings: dict, batch_size: int):
    """A call of `runner` on `batch_size` copies of `inputs` for `n` new tokens, returning its steps and tokens."""

    def run(n: int) -> tuple[int, int]:
        if batch_size == 1:
            runner.generate(**inputs, max_new_tokens=n, **settings)
            return runner.last_stats.iterations, runner.last_stats.new_tokens
        # The rows are copies of one prompt: they decode in step, so a row's steps are the batch's.
        rows = ((b, inputs) for b in range(batch_size))
        results = list(runner.stream(rows, batch_size, max_new_tokens=n, **settings))
        return max(r.stats.iterations for r in results), sum(r.stats.new_tokens for r in results)

    return run


def _traced_difference(run, new_tokens: int) -> tuple[TraceCounts, tuple[int, int]]:
    """`_difference` for a compiled pair: the traced counts of `run(new_tokens)` less those of `run(2)`, after an
    uncounted `run(new_tokens)` (the warm-up); graphs compiled are those of both counted calls."""
    run(new_tokens)
    short_counts, short = traced(lambda: run(2))
    long_counts, long = traced(lambda: run(new_tokens))
    difference = long_counts - short_counts
    difference.compiled = long_counts.compiled + short_counts.compiled
    return difference, (long[0] - short[0], long[1] - short[1])


@dataclass
class Recompiles:
    """Graphs a compiled pair compiled while `method` decoded `prompts` prompts (of different lengths) under `config`,
    after its warm-up."""

    method: str
    config: str
    prompts: int
    compiled: int


def recompiles_over_prompts(
    spec: SpeculativeVLM, policy: str, prompts: list[dict], new_tokens: int, config: str, batch_size: int = 1
) -> Recompiles:
    """Graphs compiled while `policy` decodes every prompt of `prompts` (one at a time, or streamed `batch_size` at a
    time: rows finish and join, so the batch meets every smaller bucket) under `config`, after the policy's warm-up
    under it (`SpeculativeVLM.warm_up` on the longest prompt, at every bucket up to `batch_size`): every one is a
    recompile a user meets."""
    chosen = _ON_ACCELERATORS[policy]() if policy in _ON_ACCELERATORS else policy
    runner = spec.with_options(chosen, pruning=None, verification=spec.verification)
    settings = config_settings(config, None if spec.processor is None else spec.processor.tokenizer)
    longest = max(prompts, key=lambda p: p["input_ids"].shape[1])
    runner.warm_up(new_tokens, batch_size, generation=settings, **longest)
    before = counters["stats"]["unique_graphs"]
    if batch_size == 1:
        for prompt in prompts:
            runner.generate(**prompt, max_new_tokens=new_tokens, **settings)
    else:
        list(runner.stream(enumerate(prompts), batch_size, max_new_tokens=new_tokens, **settings))
    compiled = counters["stats"]["unique_graphs"] - before
    return Recompiles(_named(policy, batch_size), config, len(prompts), compiled)


def recompiles_table(rows: list[Recompiles]) -> str:
    """One row per method and config: the graphs compiled over the prompts after warm-up."""
    lines = ["| method | config | prompts | graphs compiled after warm-up |", "| --- " * 4 + "|"]
    lines += [f"| {r.method} | {r.config} | {r.prompts} | {r.compiled} |" for r in rows]
    return "\n".join(lines)


def _named(method: str, batch_size: int) -> str:
    return method if batch_size == 1 else f"{method}, B={batch_size}"


def _full(counts: Counter) -> dict[str, float]:
    return {s: float(counts[s]) for s in SCOPES}


def run_profile(
    spec: SpeculativeVLM,
    inputs: dict,
    new_tokens: int,
    policies=POLICIES,
    configs=tuple(CONFIGS),
    batch_size: int = 1,
):
    """Every policy under every config, and plain `generate` under each config where `spec` runs eager, on one prompt
    (B copies of it)."""
    profiles = []
    inputs = {k: v.to(spec.target.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    batch = inputs
    if batch_size > 1:
        pad = spec.processor.tokenizer.pad_token_id
        batch = spec._target_runner.adapter.join_rows([inputs] * batch_size, pad)
    for config in configs:
        torch.manual_seed(0)
        tokenizer = None if spec.processor is None else spec.processor.tokenizer
        if not spec.compiled:
            profiles.append(profile_generate(spec.target, batch, new_tokens, config, tokenizer))
        for policy in policies:
            torch.manual_seed(0)
            profiles.append(profile_policy(spec, policy, inputs, new_tokens, config, batch_size))
    return profiles


def markdown_table(profiles: list[Profile]) -> str:
    """One row per method and config: counts per step, and the decoder's own per emitted token (compiled regions,
    operators outside them, reads and graphs compiled after warm-up, for a compiled pair)."""
    if profiles and profiles[0].traced is not None:
        return _traced_table(profiles)
    lines = [
        "| method | config | steps | tokens/step | per step: target launches | draft launches | draft forwards | "
        "own launches | own host reads | host reads in forwards | per draft forward: launches | "
        "per token: own launches | own host reads |",
        "| --- " * 13 + "|",
    ]
    for p in profiles:
        step, token = p.per("step"), p.per("token")
        forwards = (p.forwards or {}).get("draft", 0.0) / max(p.steps, 1e-9)
        level = p.draft_launches_per_forward
        lines.append(
            f"| {p.method} | {p.config} | {p.steps:.0f} | {p.tokens / max(p.steps, 1):.2f} | "
            f"{step['target launches']:.0f} | {step['draft launches']:.0f} | {forwards:.1f} | "
            f"{step['own launches']:.0f} | {step['own reads']:.1f} | {step['reads in forwards']:.1f} | "
            f"{'-' if level is None else f'{level:.0f}'} | {token['own launches']:.0f} | {token['own reads']:.1f} |"
        )
    return "\n".join(lines)


def _traced_table(profiles: list[Profile]) -> str:
    """The table of a compiled pair's profiles."""
    lines = [
        "| method | config | steps | tokens/step | per step: compiled regions | operators outside them | "
        "host reads | graphs compiled after warm-up |",
        "| --- " * 8 + "|",
    ]
    for p in profiles:
        step = per_step(p.traced, p.steps)
        lines.append(
            f"| {p.method} | {p.config} | {p.steps:.0f} | {p.tokens / max(p.steps, 1):.2f} | {step['regions']:.1f} | "
            f"{step['outside']:.0f} | {step['reads']:.1f} | {step['compiled']:.0f} |"
        )
    return "\n".join(lines)
