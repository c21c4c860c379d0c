"""How often the target accepts what the draft proposes, learned from the trees it has verified.

A draft's probabilities are not calibrated: a child the draft gives 0.6 may be accepted 90 % of the time. Every
verified tree tells, for each child whose parent was accepted, the draft's conditional probability q and whether
the target accepted it. Binning q gives the acceptance rate c(q); the expected accepted length of a tree is then
the sum over its nodes of the product of c(q) along their paths. Counts decay, so the estimate follows the text.
"""

from __future__ import annotations

import numpy as np
import torch


class AcceptanceCalibration:
    """Acceptance rate per bin of the draft's conditional probability, and the chance that a path goes on.

    Each bin starts from `prior` pseudo-observations at its own centre (a calibrated draft); every verified tree
    multiplies the old counts by `1 - 1 / memory` first, so the last `memory` or so trees dominate.
    """

    def __init__(self, bins: int = 20, prior: float = 4.0, memory: float = 200.0):
        self.bins = bins
        self.decay = 1.0 - 1.0 / memory
        centres = (np.arange(bins) + 0.5) / bins
        self.accepted = prior * centres
        self.tested = np.full(bins, prior)
        self.continued = prior * 0.5
        self.expanded = prior
        self._tables: dict[torch.device, tuple[int, torch.Tensor]] = {}
        self._version = 0

    @property
    def rates(self) -> np.ndarray:
        """c(q) at each bin: bin i holds q in (i / bins, (i + 1) / bins]."""
        return self.accepted / self.tested

    @property
    def continuation(self) -> float:
        """P(one of a node's children is accepted | the node was accepted and had children)."""
        return self.continued / self.expanded

    def table(self, device: torch.device) -> torch.Tensor:
        """c(q) as a lookup table on `device`: entry 0 for q = 0, entry i for q in ((i - 1) / bins, i / bins]."""
        version, table = self._tables.get(device, (-1, None))
        if version != self._version:
            table = torch.tensor(np.concatenate([[0.0], self.rates]), dtype=torch.float32, device=device)
            self._tables[device] = (self._version, table)
        return table

    def rate(self, probs: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """c(q) for draft probabilities `probs` (any shape, any device); 0 where the draft gives 0."""
        table = self.table(probs.device) if table is None else table
        return table[(probs * self.bins).ceil_().long()]

    def observe(self, parents: torch.Tensor, log_probs: torch.Tensor, path: torch.Tensor) -> None:
        """Learn from one verified tree: its `parents` and cumulative `log_probs` per node, and the accepted `path`
        (node indices from the root on). A few dozen numbers: counted on the host, where small arrays are cheap."""
        parents, log_probs, path = parents.cpu().numpy(), log_probs.cpu().double().numpy(), path.cpu().numpy()
        size = parents.shape[0]
        on_path = np.zeros(size, dtype=bool)
        on_path[path] = True
        child_parents = parents[1:]
        tested = on_path[child_parents]
        probs = np.exp(log_probs[1:] - log_probs[child_parents])[tested]
        index = np.clip(np.ceil(probs * self.bins).astype(np.int64) - 1, 0, self.bins - 1)
        self.accepted *= self.decay
        self.tested *= self.decay
        self.accepted += np.bincount(index, weights=on_path[1:][tested], minlength=self.bins)
        self.tested += np.bincount(index, minlength=self.bins)
        has_children = np.zeros(size, dtype=bool)
        has_children[child_parents] = True
        self.continued = self.decay * self.continued + (path.shape[0] - 1)
        self.expanded = self.decay * self.expanded + (path.shape[0] - 1) + int(has_children[path[-1]])
        self._version += 1

    def expected_accepted(self, parents: torch.Tensor, log_probs: torch.Tensor, ancestors: torch.Tensor) -> float:
        """Expected accepted draft tokens of a tree: over its nodes, the product of c(q) along each path."""
        if parents.shape[0] < 2:
            return 0.0
        parents, log_probs = parents.cpu().numpy(), log_probs.cpu().double().numpy()
        probs = np.exp(log_probs[1:] - log_probs[parents[1:]])
        index = np.clip(np.ceil(probs * self.bins).astype(np.int64), 0, self.bins)
        log_rates = np.log(np.maximum(np.concatenate([[0.0], self.rates])[index], 1e-30))
        return float(np.exp(ancestors[1:, 1:].cpu().numpy() @ log_rates).sum())
