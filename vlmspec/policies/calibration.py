"""How often the target accepts what the draft proposes, learned from the trees it has verified.

A draft's probabilities are not calibrated: a child the draft gives 0.6 may be accepted 90 % of the time. Every
verified tree tells, for each child whose parent was accepted, the draft's conditional probability q and whether
the target accepted it. Binning q gives the acceptance rate c(q); the expected accepted length of a tree is then
the sum over its nodes of the product of c(q) along their paths. Counts decay, so the estimate follows the text.
"""

from __future__ import annotations

import torch


class AcceptanceCalibration:
    """Acceptance rate per bin of the draft's conditional probability, and the chance that a path goes on.

    Each bin starts from `prior` pseudo-observations at its own centre (a calibrated draft); every verified tree
    multiplies the old counts by `1 - 1 / memory` first, so the last `memory` or so trees dominate.
    """

    def __init__(self, bins: int = 20, prior: float = 4.0, memory: float = 200.0):
        self.bins = bins
        self.decay = 1.0 - 1.0 / memory
        centres = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins
        self.accepted = prior * centres
        self.tested = torch.full((bins,), prior, dtype=torch.float64)
        self.continued = prior * 0.5
        self.expanded = prior
        self._tables: dict[torch.device, tuple[int, torch.Tensor]] = {}
        self._version = 0

    @property
    def rates(self) -> torch.Tensor:
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
            table = torch.cat([torch.zeros(1, dtype=torch.float64), self.rates]).to(device, torch.float32)
            self._tables[device] = (self._version, table)
        return table

    def rate(self, probs: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
        """c(q) for draft probabilities `probs` (any shape, any device); 0 where the draft gives 0."""
        table = self.table(probs.device) if table is None else table
        return table[(probs * self.bins).ceil_().long().clamp_(0, self.bins)]

    def observe(self, parents: torch.Tensor, log_probs: torch.Tensor, path: torch.Tensor) -> None:
        """Learn from one verified tree: its `parents` and cumulative `log_probs` per node, and the accepted `path`
        (node indices from the root on)."""
        parents, log_probs, path = parents.cpu(), log_probs.cpu(), path.cpu()
        size = parents.shape[0]
        on_path = torch.zeros(size, dtype=torch.bool)
        on_path[path] = True
        child_parents = parents[1:]
        tested = on_path[child_parents]
        probs = (log_probs[1:] - log_probs[child_parents]).exp()[tested].double()
        index = ((probs * self.bins).ceil_().long() - 1).clamp_(0, self.bins - 1)
        self.accepted *= self.decay
        self.tested *= self.decay
        self.accepted += torch.bincount(index, weights=on_path[1:][tested].double(), minlength=self.bins)
        self.tested += torch.bincount(index, minlength=self.bins).double()
        has_children = torch.zeros(size, dtype=torch.bool)
        has_children[child_parents] = True
        last = int(path[-1])
        self.continued = self.decay * self.continued + (path.shape[0] - 1)
        self.expanded = self.decay * self.expanded + (path.shape[0] - 1) + int(has_children[last])
        self._version += 1

    def expected_accepted(self, parents: torch.Tensor, log_probs: torch.Tensor, ancestors: torch.Tensor) -> float:
        """Expected accepted draft tokens of a tree: over its nodes, the product of c(q) along each path."""
        if parents.shape[0] < 2:
            return 0.0
        probs = (log_probs[1:] - log_probs[parents[1:]]).exp()
        log_rates = self.rate(probs).clamp_min(1e-30).log()
        return float((ancestors[1:, 1:].to(log_rates.dtype) @ log_rates).exp().sum())
