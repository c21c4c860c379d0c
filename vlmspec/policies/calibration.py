"""How often the target accepts what the draft proposes, learned from the trees it has verified.

A draft's probabilities are not calibrated: a child the draft gives 0.6 may be accepted 90 % of the time. Every
verified tree tells, for each child whose parent was accepted, the draft's conditional probability q and whether
the target accepted it. Binning q gives the acceptance rate c(q); the expected accepted length of a tree is then
the sum over its nodes of the product of c(q) along their paths. Counts decay, so the estimate follows the text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..device_tensors import host_values


class AcceptanceCalibration:
    """Acceptance rate per bin of the draft's conditional probability, and the chance that a path goes on.

    Each bin starts from `prior` pseudo-observations at its own centre (a calibrated draft); every verified tree
    multiplies the old counts by `1 - 1 / memory` first, so the last `memory` or so trees dominate. A tree has a
    few dozen nodes, so it is walked on the host in plain Python, which is faster at this size than array calls.
    """

    def __init__(self, bins: int = 20, prior: float = 4.0, memory: float = 200.0):
        self.bins = bins
        self.decay = 1.0 - 1.0 / memory
        self.accepted = [prior * (i + 0.5) / bins for i in range(bins)]
        self.tested = [prior] * bins
        self.continued = prior * 0.5
        self.expanded = prior
        self._tables: dict[torch.device, tuple[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._version = 0

    @property
    def rates(self) -> list[float]:
        """c(q) at each bin: bin i holds q in (i / bins, (i + 1) / bins], bin 0 also q = 0."""
        return [a / t for a, t in zip(self.accepted, self.tested, strict=True)]

    @property
    def continuation(self) -> float:
        """P(one of a node's children is accepted | the node was accepted and had children)."""
        return self.continued / self.expanded

    def table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """c(q) as a lookup table on `device` (entry 0 for q = 0, entry i for q in ((i - 1) / bins, i / bins]) and
        the entries' upper edges in log-probability, for `torch.bucketize`."""
        version, tables = self._tables.get(device, (-1, None))
        if version != self._version:
            edges = [-math.inf, *(math.log((i + 1) / self.bins) for i in range(self.bins))]
            # One copy that does not wait for the device: the table changes with every observed step.
            both = host_values([0.0, *self.rates, *edges], device, torch.float32)
            values, edges = both[: self.bins + 1], both[self.bins + 1 :]
            tables = (values, edges)
            self._tables[device] = (self._version, tables)
        return tables

    def rate(self, log_probs: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """c(q) for the draft's log-probabilities (any shape, any device); 0 where the draft gives 0."""
        values, edges = self.table(log_probs.device) if table is None else table
        return values[torch.bucketize(log_probs, edges)]

    def _entry(self, prob: float) -> int:
        """The lookup-table entry of a draft probability (0 for q = 0, bin + 1 otherwise)."""
        return min(self.bins, math.ceil(prob * self.bins))

    def observe(
        self,
        parents: torch.Tensor | Sequence[int],
        log_probs: torch.Tensor | Sequence[float],
        path: torch.Tensor | Sequence[int],
    ) -> None:
        """Learn from one verified tree: its `parents` and cumulative `log_probs` per node, and the accepted `path`
        (node indices from the root on)."""
        parents, log_probs, path = _host(parents), _host(log_probs), _host(path)
        decay = self.decay
        self.accepted = [a * decay for a in self.accepted]
        self.tested = [t * decay for t in self.tested]
        on_path = set(path)
        last_has_children = False
        for node in range(1, len(parents)):
            parent = parents[node]
            last_has_children |= parent == path[-1]
            if parent in on_path:
                index = max(1, self._entry(math.exp(log_probs[node] - log_probs[parent]))) - 1
                self.tested[index] += 1.0
                if node in on_path:
                    self.accepted[index] += 1.0
        self.continued = decay * self.continued + (len(path) - 1)
        self.expanded = decay * self.expanded + (len(path) - 1) + int(last_has_children)
        self._version += 1

    def expected_accepted(
        self, parents: torch.Tensor | Sequence[int], log_probs: torch.Tensor | Sequence[float]
    ) -> float:
        """Expected accepted draft tokens of a tree (nodes in level order): over its nodes, the product of c(q) along
        each path."""
        return sum(self.node_values(parents, log_probs)) - 1.0

    def node_values(self, parents: torch.Tensor | Sequence[int], log_probs: torch.Tensor | Sequence[float]) -> list:
        """Each node's chance of being accepted (the root's 1): the product of c(q) along its path."""
        parents, log_probs = _host(parents), _host(log_probs)
        table = [0.0, *self.rates]
        values = [1.0] * len(parents)
        for node in range(1, len(parents)):
            parent = parents[node]
            values[node] = values[parent] * table[self._entry(math.exp(log_probs[node] - log_probs[parent]))]
        return values


def _host(values: torch.Tensor | Sequence[float]) -> list:
    """`values` as a list (a tensor is read from its device)."""
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)
