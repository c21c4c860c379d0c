"""Whether a step drafts at all: speculation is a bet, and where the draft does not agree with the target a step that
drafts costs more than it delivers. The gate compares, per row, what a drafting step is expected to emit with what
it costs against a plain step (the target's next token alone, as `generate` decodes), both measured on the device
as decoding goes, and runs plain steps where drafting does not pay.

A drafting step of B rows takes `T_spec(B)` seconds and emits `E_r` tokens in row r (its accepted draft tokens and
the target's own); a plain step takes `T_plain(B)` and emits one token a row. Drafting pays while the rows' mean
`E_r` exceeds the cost ratio `c(B) = T_spec(B) / T_plain(B)`. `E_r` is a running mean of the row's own steps that
drafted, starting from the pair's recent rows (what the last rows of this pair delivered).

A row that stops drafting learns nothing more about its draft, so it probes: after `K` plain steps it drafts once
more (the draft first catches up on the tokens it missed, in one forward). A probe costs at most `T_spec - T_plain`
more than the plain step it replaces (it emits at least the target's own token), so probing once every `K` plain
steps costs at most `(c - 1) / (K + 1)` of plain decoding's time; `K = ceil((c - 1) / loss)` bounds that share by
`loss`. `K` is capped by `longest_run`, so the tokens a probe catches up on fit one forward of at most
`longest_run + 2` tokens: where `c > 1 + loss * longest_run` (a drafting step dearer than 3.4 plain ones, by default)
the bound is `(c - 1) / (longest_run + 1)` instead. (Compiled, a catch-up of more than 65 tokens runs at a padded
size the warm-up does not compile: it compiles on first use; on a GPU, where c is small, K stays well below that.)

Rows that sample decide without the clock: their seeded draws follow which steps drafted, so a clock-driven choice
would make a seeded call's text depend on the machine's speed or on what else is in flight. They compare their own
`E_r`, from a fixed prior, with a fixed ratio (`untimed_ratio`) and probe on a fixed interval; greedy rows, whose
output no choice can change, follow the measured costs and the pair's recent rows.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: Why a row's step ran plain (recorded in `StepRecord.plain`).
NOT_PAYING = "drafts do not pay"
LAST_TOKEN = "one token left"
TIMING = "timing a plain step"


@dataclass
class DraftGateConfig:
    """`loss`: the most probing may cost, as a share of plain decoding's time. `prior_tokens`: what a drafting step
    is expected to emit before any row of the pair has drafted (optimistic, so a new pair drafts and measures).
    `memory`: the weight of a row's newest drafting step in its running mean. `prior_ratio`: the cost ratio assumed
    until both kinds of step have been timed. `untimed_ratio`: the ratio rows that sample compare with. `cost_ratio`:
    a fixed ratio for every row instead of the measured one (None: measured). `longest_run`: the most plain steps
    between two probes. `window`: how many recent steps of each kind and batch size the step times are the median
    of. `retime`: the most drafting steps of a batch size between two plain steps that time it."""

    loss: float = 0.02
    prior_tokens: float = 3.0
    memory: float = 0.3
    prior_ratio: float = 1.5
    untimed_ratio: float = 1.5
    cost_ratio: float | None = None
    longest_run: int = 120
    window: int = 9
    retime: int = 64

    def __post_init__(self):
        if not 0 < self.loss < 1 or not 0 < self.memory <= 1:
            raise ValueError(f"loss and memory must be in (0, 1), got {self.loss} and {self.memory}")
        ratios = [self.prior_ratio, self.untimed_ratio] + ([] if self.cost_ratio is None else [self.cost_ratio])
        if self.prior_tokens < 1 or min(ratios) < 1:
            raise ValueError("prior_tokens and the cost ratios must be at least 1 (a step emits one token at least)")
        if min(self.longest_run, self.window, self.retime) < 1:
            raise ValueError("longest_run, window and retime must be at least 1")

    def interval(self, ratio: float) -> int:
        """Plain steps between probes at cost ratio `ratio`: `ceil((ratio - 1) / loss)`, from 1 to `longest_run`."""
        return min(self.longest_run, max(1, math.ceil((ratio - 1.0) / self.loss)))


class StepCosts:
    """The pair's measured step times by batch size: the medians of the recent drafting steps and plain steps
    (`drafting`, `plain`), and the tokens the pair's recent rows emitted per drafting step (a new row's prior). Shared
    by every row and kept across calls.

    Medians, not means: a step now and then takes many times the others (a cache growing, a collection, the machine
    busy elsewhere), and one such plain step in a mean would price plain decoding so high that drafting looks worth
    it for good (drafting steps never time plain ones again). The first step of a kind at a batch size runs shapes
    the process has not run before and is dropped once a second has run; a batch size counts as timed for plain
    steps once two have. While rows draft, plain steps are timed again now and then (after 4, 8, 16, ... drafting
    steps, then every `retime`), so a plain time taken while the machine was busy cannot keep rows drafting for
    good."""

    def __init__(self, config: DraftGateConfig):
        self.config = config
        self.drafting: dict[int, float] = {}
        self.plain: dict[int, float] = {}
        self.tokens = config.prior_tokens
        self._counts: dict[tuple[bool, int], int] = {}
        self._recent: dict[tuple[bool, int], deque[float]] = {}
        self._drafted_since: dict[int, int] = {}

    def ratio(self, rows: int) -> float:
        """`T_spec / T_plain` at `rows` rows: from the nearest batch size where both were timed (drafting steps past
        the first), else the prior."""
        c = self.config
        if c.cost_ratio is not None:
            return c.cost_ratio
        # The first drafting step at a batch size is its warm-up (shapes, and compiling where compiled): alone, it
        # would price drafting so high that no second drafting step ever runs to replace it.
        timed = [b for b in self.drafting if b in self.plain and self._counts[(True, b)] >= 2]
        if not timed:
            return c.prior_ratio
        nearest = min(timed, key=lambda b: (abs(math.log(b / rows)), b))
        return max(1.0, self.drafting[nearest] / self.plain[nearest])

    def untimed(self, rows: int) -> bool:
        """Whether the next step of `rows` rows should be a plain one that is timed: fewer than two have been, or
        enough drafting steps ran since the last (never where the ratio is fixed)."""
        if self.config.cost_ratio is not None:
            return False
        timed = self._counts.get((False, rows), 0)
        return timed < 2 or self._drafted_since.get(rows, 0) >= min(self.config.retime, 2**timed)

    def observe(self, rows: int, seconds: float, drafted: bool) -> None:
        """A step of `rows` rows took `seconds` (wall time, its one read included)."""
        key = (drafted, rows)
        count = self._counts[key] = self._counts.get(key, 0) + 1
        self._drafted_since[rows] = self._drafted_since.get(rows, 0) + 1 if drafted else 0
        recent = self._recent.setdefault(key, deque(maxlen=self.config.window))
        if count == 2:
            recent.clear()  # the first was a warm-up
        recent.append(seconds)
        (self.drafting if drafted else self.plain)[rows] = statistics.median(recent)

    def observe_tokens(self, emitted: int, rows: int) -> None:
        """A row's drafting step emitted `emitted` tokens, one of `rows` rows (so the pair's mean spans about as many
        steps whatever the batch size)."""
        self.tokens += self.config.memory / max(rows, 1) * (emitted - self.tokens)


class RowGate:
    """One row's side of the gate: what its drafting steps emit (a running mean from its first drafting step on, the
    pair's recent rows' before that, or the fixed prior while it samples) and how many plain steps it has run since
    it last drafted. Whether the row samples is fixed for its life and passed to each method that depends on it."""

    def __init__(self, costs: StepCosts):
        self.costs = costs
        self.since = 0
        self._tokens: float | None = None

    def expected_tokens(self, samples: bool) -> float:
        """The tokens a drafting step is expected to emit in this row (`samples`: whether it samples, so its first
        expectation is the fixed prior rather than the clock-driven pair's recent rows')."""
        if self._tokens is not None:
            return self._tokens
        return self.costs.config.prior_tokens if samples else self.costs.tokens

    def wants(self, ratio: float, samples: bool) -> bool:
        """Whether this row (sampling or not, `samples`) drafts next at cost ratio `ratio`: it pays, or its probe is
        due."""
        return self.expected_tokens(samples) > ratio or self.since >= self.costs.config.interval(ratio)

    def observe(self, emitted: int, rows: int, samples: bool) -> None:
        """A drafting step emitted `emitted` tokens in this row (`rows` rows drafted together); a greedy row's
        tokens (`samples` False) also teach the pair's recent rows, a sampled row's do not."""
        expected = self.expected_tokens(samples)
        self._tokens = expected + self.costs.config.memory * (emitted - expected)
        self.since = 0
        if not samples:
            self.costs.observe_tokens(emitted, rows)

    def skipped(self) -> None:
        """The row ran a plain step."""
        self.since += 1


def choose_drafting(gates: Sequence[RowGate], sampling: Sequence[bool], rooms: Sequence[int]) -> list[str | None]:
    """Per row, None where it drafts this step, else why it does not (`NOT_PAYING`, `LAST_TOKEN`, `TIMING`).

    Greedy rows draft together or not at all: a drafting step verifies every row's tree padded to the largest, so what
    decides is whether the greedy rows' mean expected tokens exceed the measured cost ratio (or a probe is due). When
    plain steps of the batch's size need timing (`StepCosts.untimed`: the first two, then one now and then while rows
    draft) and no row that samples drafts, the step runs plain to time one (`TIMING`), so the ratio is measured
    before it is relied on, and again as it drifts. Rows that sample decide alone, by the untimed ratio. Once any row
    drafts the step costs a drafting step's time, so every greedy row drafts in it; a row with one token left never
    drafts (no draft token could be emitted)."""
    rows = len(gates)
    if len(sampling) != rows:
        raise ValueError(f"{rows} gates but {len(sampling)} sampling flags")
    config, costs = gates[0].costs.config, gates[0].costs
    untimed = config.untimed_ratio if config.cost_ratio is None else config.cost_ratio
    sampled_drafts = {b for b in range(rows) if sampling[b] and rooms[b] > 1 and gates[b].wants(untimed, True)}
    greedy = [b for b in range(rows) if not sampling[b] and rooms[b] > 1]
    timing = bool(greedy) and not sampled_drafts and costs.untimed(rows)
    greedy_drafts = False
    if greedy and not timing:
        ratio = costs.ratio(rows)
        mean = sum(gates[b].expected_tokens(False) for b in greedy) / len(greedy)
        greedy_drafts = mean > ratio or any(gates[b].since >= config.interval(ratio) for b in greedy)
    any_drafts = greedy_drafts or bool(sampled_drafts)
    reasons: list[str | None] = []
    for b in range(rows):
        if rooms[b] <= 1:
            reasons.append(LAST_TOKEN)
        elif b in sampled_drafts or (not sampling[b] and any_drafts):
            reasons.append(None)
        else:
            reasons.append(TIMING if timing and not sampling[b] else NOT_PAYING)
    return reasons
