"""Compiled forwards: when `torch.compile` runs a model's decoding forward, and how it is set up.

Compiled, a decoding forward sees fixed shapes only: the cache is fixed (a fixed `RowCache`), the tokens are padded
(`padded_size`: 1, 2, 4, 8, 16, then multiples of 16), the rows to a bucket of slots (`row_bucket`), and the mask
spans the cache's rounded capacity; those sizes are dynamic in the graphs (`mark_varying`), so each model compiles a
handful of graphs. On CUDA the graphs are also captured (`mode="reduce-overhead"`), one per padded size, bucket
and capacity: one replay per forward instead of hundreds of launches. On the CPU inductor fuses the forward.

`"auto"` compiles on CUDA and runs eager elsewhere: on the CPU compiled decoding of the demo pair measured faster
in the steady state (0.27 s against 0.34 s a call of 64 tokens), but compiling every padded size takes 20-50 s,
which a one-off call or a short job never earns back (docs/benchmarks.md); on CUDA, where launches cost, the rule
awaits a measurement. Quantised (bitsandbytes) and offloaded models always run eager.

`"auto"` must never cost a user their output: a pair's `CompileGuard` sends it back to eager for good, with one
warning, when a compiled forward raises (compiling, capturing a CUDA graph, or replaying it) or when, checked once per
model at first use, its compiled forwards choose other tokens than its eager ones. `"on"` raises instead.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._triton import has_triton
from transformers import PreTrainedModel

from .fixed_forward import FixedForward

logger = logging.getLogger(__name__)

COMPILE_CHOICES = ("auto", "on", "off")
#: A setting beside `COMPILE_CHOICES`: the compiled path's fixed shapes (padded sizes, row buckets, a mask over the
#: cache's capacity) run eager, without compiling: what a compiled run decodes minus the compiler, to tell a shape bug
#: from a compiler bug. Failures raise, as under `"on"`.
FIXED_SHAPES = "shapes"
#: Overrides `compile="auto"` everywhere (`on` or `off`), e.g. to run a test suite compiled.
COMPILE_ENV = "VLMSPEC_COMPILE"

#: Where a model keeps its compiled form (in its `__dict__`, not as a submodule), so every wrapper of the model
#: shares its compiled graphs and they go when the model goes.
_ATTRIBUTE = "_vlmspec_compiled"
#: Device types on which `compile="auto"` compiles: where each kernel launch costs enough for graphs to pay.
AUTO_DEVICE_TYPES = ("cuda",)
#: Tokens of the greedy decode that checks, once per model under `"auto"`, its compiled forwards against eager ones.
CHECK_TOKENS = 8
#: Graphs one forward may hold (row buckets x padded sizes x cache capacities x models); torch's default of 8 would
#: send further shapes back to eager.
RECOMPILE_LIMIT = 256
_NOTICES: set[tuple[int, str]] = set()
#: Where inductor keeps its compiled graphs between processes (torch's own variable; vlmspec sets it where unset).
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_folder() -> Path:
    """The folder compiled graphs persist in between processes, so a second process starts warm: `vlmspec/inductor`
    under the user's cache folder (`XDG_CACHE_HOME`, else `~/.cache`), rather than torch's default under `/tmp`,
    which a reboot empties. `TORCHINDUCTOR_CACHE_DIR` chooses another."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlmspec" / "inductor"


def resolve_compile(setting: str | bool) -> str:
    """`True`/`False`/`"on"`/`"off"`/`"auto"`/`"shapes"` as one of `COMPILE_CHOICES` or `FIXED_SHAPES`; `"auto"`
    takes `VLMSPEC_COMPILE`."""
    choices = (*COMPILE_CHOICES, FIXED_SHAPES)
    choice = {True: "on", False: "off"}.get(setting, setting) if isinstance(setting, bool) else setting
    if choice not in choices:
        raise ValueError(f"compile must be True, False or one of {', '.join(choices)}, got {setting!r}")
    if choice == "auto":
        override = os.environ.get(COMPILE_ENV, "auto").strip().lower()
        if override not in choices:
            raise ValueError(f"{COMPILE_ENV} must be one of {', '.join(choices)}, got {override!r}")
        choice = override
    return choice


def _why_eager(model: PreTrainedModel) -> str | None:
    """Why `model` cannot be compiled, or None."""
    if getattr(model, "is_quantized", False) or getattr(model, "quantization_method", None) is not None:
        return "it is quantised, and such models cannot be compiled"
    devices = set(getattr(model, "hf_device_map", {}).values())
    if devices & {"cpu", "disk"} and len(devices) > 1:
        return "it is offloaded, and such models cannot be compiled"
    return None


def compiled_forward(model: PreTrainedModel, setting: str | bool, role: str) -> Callable | None:
    """The compiled `FixedForward` of `model` to run its decoding forwards through (one region from the rows' tokens to
    the logits), or None to run them eager (with a one-line
    notice, once per model, when compiling was asked for or is the default and cannot be had). Under `"auto"` a model
    whose compiled forwards once failed, or failed their check, runs eager (it was reported then). Under `"shapes"`
    its `FixedForward` uncompiled: the forwards take the compiled path's fixed shapes."""
    choice = resolve_compile(setting)
    if choice == FIXED_SHAPES:
        return FixedForward(model)
    device = model.get_input_embeddings().weight.device
    if choice == "off" or (choice == "auto" and device.type not in AUTO_DEVICE_TYPES):
        return None
    why = _why_eager(model)
    if why is None and device.type == "cuda" and not has_triton():
        why = "torch.compile needs Triton on CUDA, and it is not installed"
    if why is not None:
        if (id(model), why) not in _NOTICES:
            _NOTICES.add((id(model), why))
            logger.warning("vlmspec: the %s runs eager: %s", role, why)
        return None
    held = model.__dict__.get(_ATTRIBUTE)
    if held is None or held.owner != id(model):
        os.environ.setdefault(CACHE_ENV, str(cache_folder()))
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        mode = "reduce-overhead" if device.type == "cuda" else None
        held = model.__dict__[_ATTRIBUTE] = _Held(
            torch.compile(FixedForward(model), dynamic=False, mode=mode), id(model)
        )
    if choice == "auto" and held.failure is not None:
        return None
    return held.module


class _Held:
    """A model's compiled form, kept in the model's `__dict__` and valid for that model only: copies and pickles
    of the model leave it behind or ignore it (a copy compiles its own), so it never runs another model's weights.
    `checked` says its compiled forwards passed the check against eager ones; `failure` why they must not run under
    `"auto"` (every wrapper of the model, e.g. `SpeculativeVLM.with_options`, then runs it eager)."""

    __slots__ = ("module", "owner", "checked", "failure")

    def __init__(self, module: Callable, owner: int):
        self.module = module
        self.owner = owner
        self.checked = False
        self.failure: str | None = None

    def __copy__(self) -> None:
        return None

    def __deepcopy__(self, memo: dict) -> None:
        return None

    def __reduce__(self) -> tuple:
        return type(None), ()


def _held(model: PreTrainedModel) -> _Held | None:
    held = model.__dict__.get(_ATTRIBUTE)
    return held if held is not None and held.owner == id(model) else None


class GuardedRunner:
    """A runner of one model whose forwards may run through a compiled form under the pair's `guard`: `compiled` is
    that form while the guard allows it, None to run eager (no compiled form, or the guard fell back)."""

    def __init__(self, adapter: Any, compiled: Callable | None, guard: CompileGuard | None, role: str):
        self.adapter = adapter
        self.role = role
        self._compiled = compiled
        self.captured: dict[str, Callable] = {}
        self.guard = guard if compiled is not None else None
        if self.guard is not None:
            self.guard.attach(adapter.model)

    @property
    def compiled(self) -> Callable | None:
        """The compiled form the forwards run through, or None to run eager (also once the pair's guard fell back)."""
        return None if self.guard is not None and self.guard.failure is not None else self._compiled

    @property
    def captures(self) -> bool:
        """Whether the step's own work runs compiled too (`Captured`): while the forwards run compiled, not merely at
        fixed shapes."""
        return self.compiled is not None and not isinstance(self.compiled, FixedForward)

    def refresh(self) -> None:
        """Read the model's device and dtype (once per call: looking them up costs more than a tree operation)."""
        self.device = self.adapter.device
        self.dtype = self.adapter.dtype


class CompileGuard:
    """What a pair does when its compiled forwards misbehave. Under `compile="on"` (`strict`) a forward that raises
    raises. Under `"auto"` the pair (both models) runs eager from then on, with one warning that names the error and
    `compile="on"` as the way to see it raise; a forward that failed is run again eager, so the call in flight loses
    nothing. Under `"auto"` each model is also checked once at first use (`ModelRunner.check_compiled`, before the rows'
    first step): its compiled forwards must choose the tokens its eager ones choose on a short greedy decode, or the
    pair falls back the same way.

    The guard decides and the runners ask: `failure` (None while compiled forwards may run) is what every runner of
    the pair reads before a compiled forward; the guard changes no runner.
    """

    def __init__(self, setting: str | bool):
        self.strict = resolve_compile(setting) in ("on", FIXED_SHAPES)
        self.failure: str | None = None
        self.models: weakref.WeakSet[PreTrainedModel] = weakref.WeakSet()

    def attach(self, model: PreTrainedModel) -> None:
        """Count `model` in the pair: a fallback marks its compiled form failed for every wrapper of it too."""
        self.models.add(model)

    def needs_check(self, runner: GuardedRunner) -> bool:
        """Whether `runner`'s compiled forwards are still to be checked against its eager ones (under `"auto"` only)."""
        held = _held(runner.adapter.model)
        return not self.strict and runner.compiled is not None and held is not None and not held.checked

    def check(self, runner: GuardedRunner, greedy: Callable[[bool], list]) -> None:
        """Under `"auto"`, once per model: compare the tokens `greedy(True)` chooses through `runner`'s compiled
        forwards with those `greedy(False)` chooses through eager ones (a short greedy decode), and let the model run
        on compiled or fall the pair back."""
        if not self.needs_check(runner):
            return
        chosen = {}
        for compiled in (True, False):
            chosen[compiled] = greedy(compiled)
            if self.failure is not None:
                return
        if chosen[True] == chosen[False]:
            self.passed(runner)
        else:
            self.fall_back(
                f"the {runner.role}'s compiled forwards chose other tokens than its eager ones on a "
                f"{CHECK_TOKENS}-token greedy decode (compiled {chosen[True]}, eager {chosen[False]})"
            )

    def passed(self, runner: GuardedRunner) -> None:
        """`runner`'s model passed its check: no wrapper of it checks it again."""
        held = _held(runner.adapter.model)
        if held is not None:
            held.checked = True

    def fall_back(self, what: str, error: Exception | None = None) -> None:
        """`what` went wrong in a compiled forward (`error`, if it raised): raise it under `"on"`; under `"auto"` decide
        that the pair runs eager from now on (every wrapper of its models too) and say so once."""
        if self.strict and error is not None:
            raise error
        reason = what if error is None else f"{what} raised {_describe(error)}"
        self.failure = reason
        for model in list(self.models):
            held = _held(model)
            if held is not None:
                held.failure = reason
        logger.warning(
            "vlmspec: compiled decoding is off for this pair (target and draft run eager from now on): %s. "
            'Pass compile="on" (--compile on, or %s=on) to %s.',
            reason,
            COMPILE_ENV,
            "see it raise" if error is not None else "run it compiled regardless",
        )


class Captured:
    """A pure tensor function of the step (tensors and typed tensor records in, tensors out, no host read), run as one
    compiled region (`fullgraph=True`) while `runner.captures`, else eager, with dynamic shapes from the first graph
    (`dynamic=True`: every size and host number symbolic, except sizes of 0 and 1 and the numbers the function
    branches or indexes host structures on, which dynamo specialises), so that a graph compiled at warm-up serves
    the trees, rows and budgets later steps meet. Each runner keeps its own
    compiled form (`GuardedRunner.captured`); dynamo's graphs are shared by all. A compiled call that raises raises
    under `compile="on"`; under `"auto"` the pair falls back to eager (the `CompileGuard`) and the call is run again
    eager."""

    def __init__(self, function: Callable, name: str):
        self.function = function
        self.name = name

    def __call__(self, runner: GuardedRunner, *args: Any) -> Any:
        if not runner.captures:
            return self.function(*args)
        compiled = runner.captured.get(self.name)
        if compiled is None:
            compiled = runner.captured[self.name] = torch.compile(self.function, fullgraph=True, dynamic=True)
        try:
            return compiled(*args)
        except Exception as error:
            if runner.guard is None:
                raise
            runner.guard.fall_back(f"the compiled {self.name}", error)
            return self.function(*args)


def _describe(error: BaseException) -> str:
    """An error's type and first line, and those of its root cause (compiler errors wrap the real one, as dynamo's
    `inner_exception` or as the cause, and run to pages)."""
    root = error
    while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
        root = inner
    text = f"{type(error).__name__}: {_first_line(error)}"
    return text if root is error else f"{text} (caused by {type(root).__name__}: {_first_line(root)})"


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "(no message)"


#: The most tokens a decoding forward feeds: a tree of 64 nodes and its root (the policies' node cap).
LARGEST_FORWARD = 65


def padded_sizes(largest: int) -> list[int]:
    """Every padded size a forward of 1 to `largest` tokens runs at."""
    return sorted({padded_size(count) for count in range(1, largest + 1)})


def padded_size(count: int) -> int:
    """The fixed size a compiled forward of `count` tokens runs at: the next power of two up to 16, then the next
    multiple of 16 (a 65-node SAGE tree runs at 80, not 128)."""
    if count <= 16:
        return 1 << max(0, count - 1).bit_length()
    return -(-count // 16) * 16


def row_bucket(rows: int) -> int:
    """The rows a compiled batched forward runs over for `rows` in flight: the next power of two, so a batch meets
    few distinct shapes as its rows finish."""
    return 1 << max(0, rows - 1).bit_length()


def fixed_capacity(positions: int) -> int:
    """A cache capacity of at least `positions` from a small set (eight sizes per doubling, multiples of 256), so
    compiled forwards meet few distinct shapes and at most an eighth of the cache goes unused."""
    power = 1 << max(0, math.ceil(math.log2(max(positions, 1))))
    step = max(256, power // 16)
    return -(-positions // step) * step
