"""HeteroSpec: SAGE's entropy-shaped trees, extended and cut by the calibrated bin of the step's most confident path.

Each expanded node's draft distribution gives its instantaneous top-K entropy I = -sum p~ log p~ over its top-K
probabilities renormalised; a path's cumulative meta-path entropy is Phi(P) = sum_t I_t along it (HeteroSpec eq. 1),
read for P*, the candidate path (a root-to-leaf path of the drafted tree) whose last token the draft gave the highest
probability. Phi(P*) falls in one of the bins a 3-level regression tree fitted offline to (Phi, terminal confidence
rank) pairs of fully accepted paths laid out (eq. 2, `vlmspec calibrate`, `PathEntropyBins`). In the low-entropy bins
B_i (i < len(gammas)) the next tree goes deeper, d' = d + Delta(B_i) with Delta(B_i) = alpha - i and alpha =
ceil(d / 2) (Dynamic Extended Drafting; the paper's Table 3 finds ceil(depth / 2) best), and its verified nodes are cut
to N' = gamma_i N + Delta(B_i) (Top-N Pruning, gamma 0.3 / 0.6 / 1.0), the nodes kept the most probable paths.

Two departures from the paper keep the step one packed read and fixed shapes: the bin of step t's tree shapes step
t + 1's (as SAGE's alpha does; the paper decides within the step, which would wait on the device for the depth), and
Dynamic Computational Adaptation's graph per bin is the engine's graph per padded tree size, which the bins' trees
map onto. The output is the target's whatever the bins: they change only which tree is drafted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .base import RankTreePlan, StepLesson, StepOutcome, TreePlan
from .levels import NodeMeasure
from .path_bins import CalibrationError, PathEntropyBins, bins_beside
from .sage import AdaptiveTreePlan, SageConfig, SagePolicy

if TYPE_CHECKING:
    from ..engine.tree import Trees


@dataclass(frozen=True)
class TopKLogProbs:
    """What the growth keeps of every expanded node for eq. 1: its `top_k` most probable draft log-probabilities
    (B, F, top_k), the level's sorted top where it holds that many, else their own top-k of the log-probabilities
    (B, F, V). One copy a level; the entropies are taken once a step, over all nodes (`node_entropies`)."""

    top_k: int

    def __call__(self, log_probs: torch.Tensor, top_log_probs: torch.Tensor) -> torch.Tensor:
        if top_log_probs.shape[-1] >= self.top_k:
            return top_log_probs[..., : self.top_k]
        return log_probs.topk(self.top_k, dim=-1).values


def top_k_entropy(top_log_probs: torch.Tensor) -> torch.Tensor:
    """-sum p~ log p~ over the renormalised probabilities of `top_log_probs` (..., k) (a -inf entry counts 0; NaN
    entries give NaN)."""
    return torch.special.entr(torch.softmax(top_log_probs.float(), dim=-1)).sum(-1)


def best_path_entropy(trees: Trees, entropy: torch.Tensor) -> torch.Tensor:
    """Phi(P*) of every row's tree (B,), from each node's instantaneous entropy `entropy` (B, N; NaN for a node never
    expanded): over the tree's root-to-leaf paths, the one whose last token has the highest draft probability given
    its parent, and the sum of its ancestors' entropies (the distributions its tokens were drawn from). A row of its
    root alone (one that drafted nothing) gives 0. A fixed number of operations, whatever the rows and trees."""
    known = entropy.nan_to_num(0.0)
    ancestors = trees.row_ancestors()
    phi = (ancestors.to(known.dtype) @ known[..., None])[..., 0] - known
    last_token = trees.log_probs - trees.log_probs.gather(1, trees.row_parents().clamp_min(0))
    last_token[:, 0] = -torch.inf  # the root is no candidate (a row of its root alone then takes its Phi, 0)
    # A leaf is its own only descendant (padding has no ancestors, not even itself).
    best = torch.where(ancestors.sum(1) == 1, last_token, -torch.inf).argmax(dim=1, keepdim=True)
    return phi.gather(1, best)[:, 0]


def terminal_confidence_rank(parents: list[int], log_probs: list[float], path: list[int]) -> int:
    """The rank (1 = the most probable) among the tree's drafted nodes, by path probability, of the last node of the
    accepted `path` (node indices from the root on): the paper's TCR."""
    last = log_probs[path[-1]]
    return 1 + sum(1 for node in range(1, len(parents)) if log_probs[node] > last)


def depth_extension(bin_index: int, depth: int, gammas: tuple[float, ...], alpha: int | None = None) -> int:
    """Delta(B_i) = alpha - i (alpha = ceil(depth / 2) unless given) in the low-entropy bins i < len(gammas), never
    below 0; 0 elsewhere."""
    if bin_index >= len(gammas):
        return 0
    return max(0, (math.ceil(depth / 2) if alpha is None else alpha) - bin_index)


def node_budget(bin_index: int, nodes: int, extension: int, gammas: tuple[float, ...]) -> int:
    """N' = gamma_i N + Delta(B_i) in the low-entropy bins i < len(gammas) (rounded, at least 1); N elsewhere."""
    if bin_index >= len(gammas):
        return nodes
    return max(1, round(gammas[bin_index] * nodes) + extension)


@dataclass
class HeteroSpecConfig:
    """HeteroSpec over SAGE (`sage`, whose depth and node cap are d and N). `bins`: the pair's `PathEntropyBins`, a
    path to their file, or None for the file `vlmspec calibrate` wrote next to the draft (refused, naming the command,
    where there is none). `gammas`: the low-entropy bins' node fractions; `extension`: the alpha of Delta (None:
    ceil(d / 2)); `depth_limit`: the deepest an extended tree goes."""

    sage: SageConfig = field(default_factory=SageConfig)
    bins: PathEntropyBins | str | Path | None = None
    gammas: tuple[float, ...] = (0.3, 0.6, 1.0)
    extension: int | None = None
    depth_limit: int = 16

    def __post_init__(self):
        if not self.gammas or any(not 0 < g <= 1 for g in self.gammas):
            raise ValueError(f"gammas must be fractions in (0, 1], got {self.gammas}")
        if self.extension is not None and self.extension < 0:
            raise ValueError(f"extension must be at least 0, got {self.extension}")


@dataclass
class PathRecord:
    """One drafted step as calibration sees it: Phi(P*), the accepted path's terminal confidence rank, its accepted
    draft tokens and whether it ended at a leaf (a fully accepted candidate path)."""

    entropy: float
    rank: int
    accepted: int
    full: bool


class HeteroSpecPolicy(SagePolicy):
    """SAGE's trees, deeper and cut to the most probable nodes where the last tree's best path had low entropy.

    With `record` it keeps every drafted step's `PathRecord` (shared by a batch's rows, in `records`) and reads each
    tree to the host with the step's results, as `vlmspec calibrate` needs; its bins may then be absent (it drafts
    SAGE's trees)."""

    name = "heterospec"

    def __init__(self, config: HeteroSpecConfig | None = None, record: bool = False):
        self.heterospec = config or HeteroSpecConfig()
        super().__init__(self.heterospec.sage)
        bins = self.heterospec.bins
        self._use_bins(PathEntropyBins.load(bins) if isinstance(bins, (str, Path)) else bins)
        self.reads_tree = record
        self.records: list[PathRecord] | None = [] if record else None

    def reset(self) -> None:
        super().reset()
        self.bin: int | None = None

    def for_row(self) -> HeteroSpecPolicy:
        own = super().for_row()
        own.records = self.records
        return own

    def bind(self, target: torch.nn.Module, draft: torch.nn.Module) -> None:
        """Take the bins beside the draft where none were given, and refuse bins fitted to another pair."""
        if self.bins is None and self.records is None:
            found = bins_beside(draft)
            if found is None:
                raise CalibrationError(
                    "policy 'heterospec' needs path-entropy bins fitted to this pair: run `vlmspec calibrate --target "
                    "TARGET --draft DRAFT` (it writes heterospec_bins.json next to the draft), or give "
                    "HeteroSpecConfig(bins=...)"
                )
            self._use_bins(PathEntropyBins.load(found))
        if self.bins is not None:
            self.bins.check_pair(target, draft)

    def _use_bins(self, bins: PathEntropyBins | None) -> None:
        """Take `bins` (None: none yet) and measure each expanded node's top-K as they were fitted with (SAGE's K
        without bins), the initial tree too."""
        self.bins = bins
        top_k = self.config.top_k if bins is None else bins.top_k
        self.measure = NodeMeasure(top_k, TopKLogProbs(top_k))
        self._initial = RankTreePlan(self.config.initial_tree, node_measure=self.measure)

    def plan(self) -> TreePlan:
        """SAGE's tree from the last root's alpha; in a low-entropy bin of the last tree's Phi(P*), deeper and cut."""
        self._planned_alpha = self.alpha
        if self._steps == 0:
            return self._initial
        c, depth = self.config, self.depth_for(self.alpha)
        nodes = c.max_nodes
        if self.bin is not None:
            extension = depth_extension(self.bin, depth, self.heterospec.gammas, self.heterospec.extension)
            nodes = node_budget(self.bin, nodes, extension, self.heterospec.gammas)
            depth = min(depth + extension, self.heterospec.depth_limit)
        plan = AdaptiveTreePlan(depth, self.width_for(self.alpha), nodes, c.top_k, c.threshold_scale, c.fixed_shapes)
        plan.node_measure = self.measure
        return plan

    def statistics(self, root_log_probs: torch.Tensor) -> None:
        """None: SAGE's alpha comes from the root's measured top-K entropy (`path_statistics`)."""
        return None

    def path_statistics(self, trees: Trees) -> torch.Tensor:
        """(B, 2): SAGE's alpha = 1 - H_root / log K from the root's top-K entropy, and Phi(P*) (NaN, both, where the
        trees carry no measures)."""
        rows = trees.tokens.shape[0]
        if trees.node_statistics is None:
            return torch.full((rows, 2), torch.nan, device=trees.tokens.device)
        entropy = top_k_entropy(trees.node_statistics)
        alpha = torch.rsub(entropy[:, 0], 1.0, alpha=1.0 / math.log(trees.node_statistics.shape[-1])).clamp(0.0, 1.0)
        return torch.stack([alpha, best_path_entropy(trees, entropy)], dim=1)

    def observe(self, step: StepOutcome) -> StepLesson:
        """SAGE's observation (alpha, history), then the bin of this tree's Phi(P*) for the next plan (alpha and bin
        unchanged where the step measured none)."""
        values = step.statistics if step.statistics is not None else [math.nan, math.nan]
        alpha, entropy = values[0], values[1]
        lesson = super().observe(replace(step, statistics=[self.alpha if math.isnan(alpha) else alpha]))
        if math.isnan(entropy):
            return lesson
        if self.bins is not None:
            self.bin = self.bins.index(entropy)
        if self.records is not None and step.tree_parents is not None:
            parents, log_probs, path = step.tree_parents, step.tree_log_probs, [int(node) for node in step.path]
            full = len(path) > 1 and path[-1] not in parents[1:]
            rank = terminal_confidence_rank(parents, log_probs, path) if len(path) > 1 else 0
            self.records.append(PathRecord(entropy, rank, step.accepted, full))
        return lesson
