"""How many tokens a batch's chains draft: the length that maximises the tokens a step is expected to emit per second
it is expected to take, from the step times and acceptances this run measures.

A row's chain of k draft tokens emits `1 + S(1) + ... + S(k)` tokens on average (the accepted ones and the target's
own next token), where S(d) is the chance that its first d draft tokens are all accepted: the product of the rates
at which a token at depth j is accepted once the tokens above it were. Those rates are counted depth by depth over
the rows' recent chains, not assumed equal: acceptance is bursty (a row in an easy stretch accepts whole chains, one
in a hard stretch few), so deep tokens are accepted more often, given their parents were, than the first ones, and
one rate for every depth would undervalue long chains. A step of B rows drafting k tokens takes about
`a + b B + (c + d B) k` seconds: the draft runs k forwards over the B rows and the target verifies B (k + 1)
tokens, each term fixed or growing with the rows, fitted by least squares over the recent steps. So the length
follows the device, the pair and the batch: long chains where a verification costs as much for 6 tokens a row as
for 1 (an accelerator, a few rows), shorter ones where it turns compute-bound. Nothing is tuned to a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost_model import WindowedLeastSquares


@dataclass
class ChainLengthConfig:
    """`default` tokens until the step times have `warmup` observations (the first steps cycle through `warmup`'s
    lengths, so the fit sees how time grows with the length), and wherever a plan may not follow measured time;
    then a length from 1 to `longest`, every `explore_every`-th step one longer than the best, one shorter or the
    longest (in turns), so the time fit keeps seeing the best's neighbours and every depth's acceptance stays measured
    (a draft's acceptance need not fall with depth: the demo pair's dips at the fourth token and recovers after).
    Times are fitted over the last `window` steps (ridge `ridge`); each depth's acceptance rate starts from `prior`
    (as `prior_trials` chains) and remembers about `memory` steps."""

    default: int = 5
    longest: int = 8
    warmup: tuple[int, ...] = (5, 3, 7, 5, 2, 4)
    explore_every: int = 4
    window: int = 64
    ridge: float = 1e-3
    prior: float = 0.75
    prior_trials: float = 8.0
    memory: float = 32.0

    def __post_init__(self):
        if not 1 <= self.default <= self.longest:
            raise ValueError(f"default must be between 1 and longest ({self.longest}), got {self.default}")
        if not self.warmup or min(self.warmup) < 1 or max(self.warmup) > self.longest:
            raise ValueError(f"warmup lengths must be between 1 and longest ({self.longest}), got {self.warmup}")
        if min(self.explore_every, self.window) < 1 or self.memory < 1 or not 0 < self.prior < 1:
            raise ValueError("explore_every, window and memory must be positive and prior in (0, 1)")


class ChainLength:
    """The chain length of each step of a batch, learned from the batch's steps (shared by its rows' policies)."""

    def __init__(self, config: ChainLengthConfig | None = None):
        self.config = c = config or ChainLengthConfig()
        self.times = WindowedLeastSquares(4, c.window, c.ridge)
        # Per depth d (index d - 1): how many recent chains reached it with every token above accepted, and how many
        # of those accepted its token too, starting from `prior` over `prior_trials` chains.
        self._reached = [c.prior_trials] * c.longest
        self._passed = [c.prior * c.prior_trials] * c.longest
        self._chosen = 0

    def rates(self) -> list[float]:
        """Per depth, the recent rate at which its draft token is accepted when every token above it was."""
        return [passed / reached for passed, reached in zip(self._passed, self._reached, strict=True)]

    def expected_tokens(self, length: int) -> float:
        """Tokens a row's chain of `length` emits on average (the target's own next token included)."""
        tokens, surviving = 1.0, 1.0
        for rate in self.rates()[:length]:
            surviving *= rate
            tokens += surviving
        return tokens

    @staticmethod
    def features(rows: int, length: int) -> tuple[float, float, float, float]:
        return (1.0, float(rows), float(length), float(rows * length))

    def seconds(self, rows: int, length: int) -> float:
        """The fitted time of a step of `rows` rows drafting `length` tokens."""
        return self.times.predict(self.features(rows, length))

    def best(self, rows: int) -> int:
        """The length with the most expected tokens per expected second for `rows` rows (the default while a fitted
        time is not positive)."""
        c = self.config
        times = {k: self.seconds(rows, k) for k in range(1, c.longest + 1)}
        if min(times.values()) <= 0.0:
            return c.default
        return max(times, key=lambda k: self.expected_tokens(k) / times[k])

    def choose(self, rows: int, timed: bool = True) -> int:
        """The next step's length for `rows` rows; with `timed` False the default (plans that follow no clock)."""
        c = self.config
        if not timed:
            return c.default
        turn = self._chosen
        self._chosen += 1
        if len(self.times) < len(c.warmup):
            return c.warmup[turn % len(c.warmup)]
        length = self.best(rows)
        if turn % c.explore_every == c.explore_every - 1:
            length = (length + 1, length - 1, c.longest)[(turn // c.explore_every) % 3]
        return min(max(length, 1), c.longest)

    def observe_step(self, rows: int, length: int, seconds: float) -> None:
        """A finished step of `rows` rows that drafted `length` tokens each, in `seconds`."""
        self.times.add(self.features(rows, length), seconds)

    def observe_row(self, accepted: int, drafted: int, rows: int) -> None:
        """One row of a step: `accepted` of its `drafted` chain tokens, one of `rows` rows (so the memory spans about
        `memory` steps however many rows a step has). Depths past the first rejection were not tried."""
        keep = 1.0 - 1.0 / (self.config.memory * max(rows, 1))
        for d in range(min(drafted, self.config.longest)):
            self._reached[d] *= keep
            self._passed[d] *= keep
            if d <= accepted:
                self._reached[d] += 1.0
                self._passed[d] += 1.0 if d < accepted else 0.0
