"""Measured costs of one draft-verify step: how long the target takes to verify a tree and the draft to grow it.

Both are linear in a few features of the step and are fitted at run time, by least squares over a window of the
most recent steps, so they follow the device, the models and the context length without constants tuned to any of
them: verification `a + b n + c n L + d L` seconds for a tree of n tokens (root included) over a cache of L tokens,
drafting `e f + g t + h t L'` seconds for f draft forwards feeding t tokens over a draft cache of L' tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Contexts enter the features in thousands of tokens, so every column has a comparable scale.
_CONTEXT_UNIT = 1000.0


def solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """x with matrix x = rhs, by Gaussian elimination with partial pivoting (systems of 3-4 unknowns, solved every
    step: plain Python is several times faster than an array library's call overhead at this size)."""
    n = len(rhs)
    rows = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            for c in range(col, n + 1):
                rows[r][c] -= factor * rows[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (rows[r][n] - sum(rows[r][c] * x[c] for c in range(r + 1, n))) / rows[r][r]
    return x


class WindowedLeastSquares:
    """y ~ w . x fitted to the last `window` observations, with a small ridge on column-scaled features.

    Keeps the window's sums of x x^T and x y, so adding an observation costs O(features^2) and the fit is solved
    only when the weights are read after a change.
    """

    def __init__(self, features: int, window: int, ridge: float):
        self.features = features
        self.ridge = ridge
        self._rows: deque[tuple[tuple[float, ...], float]] = deque()
        self._window = window
        self._gram = [[0.0] * features for _ in range(features)]
        self._moment = [0.0] * features
        self._weights = [0.0] * features
        self._stale = False

    def __len__(self) -> int:
        return len(self._rows)

    def _accumulate(self, x: Sequence[float], y: float, sign: float) -> None:
        for i, xi in enumerate(x):
            row = self._gram[i]
            for j, xj in enumerate(x):
                row[j] += sign * xi * xj
            self._moment[i] += sign * xi * y

    def add(self, x: Sequence[float], y: float) -> None:
        """Record one observation (dropping the oldest beyond the window)."""
        x = tuple(float(v) for v in x)
        self._rows.append((x, float(y)))
        self._accumulate(x, y, 1.0)
        if len(self._rows) > self._window:
            self._accumulate(*self._rows.popleft(), -1.0)
        self._stale = True

    @property
    def weights(self) -> list[float]:
        """The fit; the ridge on column-scaled features is `ridge * diag(X^T X)` on the raw ones (unused columns: 0)."""
        if self._stale:
            gram = [list(row) for row in self._gram]
            for i in range(self.features):
                gram[i][i] += self.ridge * gram[i][i] if gram[i][i] > 0 else 1.0
            self._weights = solve(gram, self._moment)
            self._stale = False
        return self._weights

    def predict(self, x: Sequence[float]) -> float:
        return sum(w * v for w, v in zip(self.weights, x, strict=True))


@dataclass
class StepCost:
    """What one step fed the models and how long they took."""

    tree_tokens: int
    target_context: int
    draft_forwards: int
    draft_tokens: int
    draft_context: int
    verify_seconds: float
    draft_seconds: float


class CostModel:
    """Running estimates of verification and drafting time, kept for as long as the policy that owns it."""

    def __init__(self, window: int = 64, ridge: float = 1e-3):
        self.verify = WindowedLeastSquares(4, window, ridge)
        self.draft = WindowedLeastSquares(3, window, ridge)

    @property
    def observations(self) -> int:
        return len(self.verify)

    @staticmethod
    def verify_features(tree_tokens: float, context: float) -> tuple[float, ...]:
        context = context / _CONTEXT_UNIT
        return (1.0, tree_tokens, tree_tokens * context, context)

    @staticmethod
    def draft_features(forwards: float, tokens: float, context: float) -> tuple[float, ...]:
        return (forwards, tokens, tokens * context / _CONTEXT_UNIT)

    def add(self, step: StepCost) -> None:
        self.verify.add(self.verify_features(step.tree_tokens, step.target_context), step.verify_seconds)
        self.draft.add(
            self.draft_features(step.draft_forwards, step.draft_tokens, step.draft_context), step.draft_seconds
        )

    def predict(self, step: StepCost) -> float:
        """Predicted drafting + verification seconds of `step`'s shape."""
        verify = self.verify.predict(self.verify_features(step.tree_tokens, step.target_context))
        draft = self.draft.predict(self.draft_features(step.draft_forwards, step.draft_tokens, step.draft_context))
        return max(0.0, verify) + max(0.0, draft)

    def node_seconds(self, target_context: int, draft_context: int) -> float:
        """Marginal cost of one more tree node: one more token to verify and to feed the draft (at least 0)."""
        w, d = self.verify.weights, self.draft.weights
        verify = w[1] + w[2] * target_context / _CONTEXT_UNIT
        draft = d[1] + d[2] * draft_context / _CONTEXT_UNIT
        return max(0.0, verify) + max(0.0, draft)

    def forward_seconds(self, draft_context: int) -> tuple[float, float]:
        """One more draft forward over n tokens costs `a + b n` seconds: (a, b), each at least 0."""
        d = self.draft.weights
        return max(0.0, d[0]), max(0.0, d[1] + d[2] * draft_context / _CONTEXT_UNIT)
