"""Measured costs of one draft-verify step: how long the target takes to verify a tree and the draft to grow it.

Both are linear in a few features of the step and are fitted at run time, by least squares over a window of the
most recent steps, so they follow the device, the models and the context length without constants tuned to any of
them: verification `a + b n + c n L + d L` seconds for a tree of n tokens (root included) over a cache of L tokens,
drafting `e f + g t + h t L'` seconds for f draft forwards feeding t tokens over a draft cache of L' tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

# Contexts enter the features in thousands of tokens, so every column has a comparable scale.
_CONTEXT_UNIT = 1000.0


class WindowedLeastSquares:
    """y ~ w . x fitted to the last `window` observations, with a small ridge on column-scaled features.

    Keeps the window's sums of x x^T and x y, so adding an observation costs O(features^2) and the fit is solved
    only when the weights are read after a change.
    """

    def __init__(self, features: int, window: int, ridge: float):
        self.features = features
        self.ridge = ridge
        self._rows: deque[tuple[np.ndarray, float]] = deque()
        self._window = window
        self._gram = np.zeros((features, features))
        self._moment = np.zeros(features)
        self._weights = np.zeros(features)
        self._stale = False

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, x: np.ndarray, y: float) -> None:
        """Record one observation (dropping the oldest beyond the window)."""
        x = np.asarray(x, dtype=np.float64)
        self._rows.append((x, float(y)))
        self._gram += np.outer(x, x)
        self._moment += x * y
        if len(self._rows) > self._window:
            old_x, old_y = self._rows.popleft()
            self._gram -= np.outer(old_x, old_x)
            self._moment -= old_x * old_y
        self._stale = True

    @property
    def weights(self) -> np.ndarray:
        if self._stale:
            scale = np.sqrt(np.clip(np.diag(self._gram), 0.0, None) / len(self._rows))
            scale[scale == 0] = 1.0
            gram = self._gram / np.outer(scale, scale) + self.ridge * len(self._rows) * np.eye(self.features)
            self._weights = np.linalg.solve(gram, self._moment / scale) / scale
            self._stale = False
        return self._weights

    def predict(self, x: np.ndarray) -> float:
        return float(np.asarray(x, dtype=np.float64) @ self.weights)


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
    def verify_features(tree_tokens: float, context: float) -> np.ndarray:
        context = context / _CONTEXT_UNIT
        return np.array([1.0, tree_tokens, tree_tokens * context, context])

    @staticmethod
    def draft_features(forwards: float, tokens: float, context: float) -> np.ndarray:
        return np.array([forwards, tokens, tokens * context / _CONTEXT_UNIT])

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
