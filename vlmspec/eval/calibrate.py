"""`vlmspec calibrate`: fit HeteroSpec's path-entropy bins to a target and draft.

The pair decodes held-out prompts (the user's `--data`, or the synthetic suite's held-out items past those the
benchmarks score) under SAGE's trees, recording at every drafted step Phi(P*), the cumulative top-K entropy of the
tree's most confident path (HeteroSpec eq. 1), and the terminal confidence rank of the accepted path. The steps whose
accepted path was a whole candidate path (it ended at a leaf: "fully accepted") are the training set of a 3-level
CART regression tree from Phi to that rank (eq. 2, scikit-learn's `DecisionTreeRegressor`, the `calibrate` extra); its
split thresholds are the bins' edges. The bins go to a small JSON file next to the draft (`CALIBRATION_FILE`), named
by both models' fingerprints.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import CalibrationError, InvalidArgumentError
from ..policies import CALIBRATION_FILE, HeteroSpecConfig, HeteroSpecPolicy, PathEntropyBins, SageConfig
from ..policies.heterospec import PathRecord
from ..policies.path_bins import fingerprint
from ..speculative import SpeculativeVLM
from .bench import synthetic_inputs
from .synthetic import items

#: Where the calibration's synthetic items start in the held-out split: past every item a benchmark scores.
HELD_OUT_START = 500
#: The fewest fully accepted paths a fit takes.
MIN_PATHS = 16


@dataclass
class CalibrationRun:
    """A finished calibration: the bins, where they were written, and the steps it recorded."""

    bins: PathEntropyBins
    path: Path
    records: list[PathRecord]


def fit_bins(records: list[PathRecord], depth: int = 3, min_leaf: int = 5, top_k: int = 10) -> PathEntropyBins:
    """The bins of a `depth`-level regression tree from Phi(P*) to the terminal confidence rank over the fully
    accepted paths of `records` (at most 2^depth bins, each leaf holding at least `min_leaf` paths): its thresholds
    as edges, each bin's mean rank and count."""
    try:
        from sklearn.tree import DecisionTreeRegressor
    except ImportError as error:
        raise CalibrationError(
            "fitting heterospec's bins needs scikit-learn: pip install 'vlmspec[calibrate]'"
        ) from error
    full = [r for r in records if r.full]
    if len(full) < MIN_PATHS:
        raise CalibrationError(
            f"only {len(full)} fully accepted paths in {len(records)} drafted steps (at least {MIN_PATHS} are needed): "
            "decode more or longer items (--n, --max-new-tokens)"
        )
    tree = DecisionTreeRegressor(max_depth=depth, min_samples_leaf=min_leaf, random_state=0)
    tree.fit([[r.entropy] for r in full], [r.rank for r in full])
    edges = sorted(float(t) for t, f in zip(tree.tree_.threshold, tree.tree_.feature, strict=True) if f >= 0)
    counts, sums = [0] * (len(edges) + 1), [0.0] * (len(edges) + 1)
    for r in full:
        index = bisect.bisect_right(edges, r.entropy)
        counts[index] += 1
        sums[index] += r.rank
    means = [round(s / c, 3) if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    return PathEntropyBins(edges=[round(e, 6) for e in edges], means=means, counts=counts, top_k=top_k)


def calibration_inputs(spec: SpeculativeVLM, data: str | None, n: int) -> list[dict[str, Any]]:
    """The prompts to decode: the first `n` items of `data` (a folder of media or a JSONL file, as train-draft reads
    it), or `n` synthetic held-out items past those the benchmarks score."""
    if spec.processor is None:
        raise InvalidArgumentError("calibration needs the target's processor (load the pair with from_pretrained)")
    if data is None:
        return [synthetic_inputs(spec.processor, item) for item in items("held-out", n, start=HELD_OUT_START)]
    from ..training.data import item_inputs, read_items

    return [item_inputs(spec.processor, item) for item in read_items(data)[:n]]


def record_paths(
    spec: SpeculativeVLM, inputs: list[dict[str, Any]], max_new_tokens: int, progress: bool = True
) -> list[PathRecord]:
    """Decode every prompt under SAGE's trees (the target's own generation config), recording each drafted step."""
    policy = HeteroSpecPolicy(HeteroSpecConfig(sage=SageConfig()), record=True)
    runner = spec.with_options(policy, spec.pruning)
    for prompt in tqdm(inputs, desc="calibrate", unit="item", disable=not progress):
        runner.generate(**prompt, max_new_tokens=max_new_tokens)
    return policy.records


def calibrate(
    spec: SpeculativeVLM,
    data: str | None = None,
    out: str | Path | None = None,
    n: int = 24,
    max_new_tokens: int = 128,
    progress: bool = True,
) -> CalibrationRun:
    """Fit the pair's bins and write them to `out` (default: `CALIBRATION_FILE` in the draft's folder)."""
    if out is None:
        source = getattr(spec.draft.config, "_name_or_path", "")
        if not source or not Path(source).is_dir():
            raise InvalidArgumentError("the draft was not loaded from a folder: give --out")
        out = Path(source) / CALIBRATION_FILE
    started = time.perf_counter()
    records = record_paths(spec, calibration_inputs(spec, data, n), max_new_tokens, progress)
    bins = fit_bins(records, top_k=SageConfig().top_k)
    bins.pair = {"target": fingerprint(spec.target), "draft": fingerprint(spec.draft)}
    bins.fitted = {
        "data": data or "synthetic held-out items",
        "items": n,
        "max_new_tokens": max_new_tokens,
        "steps": len(records),
        "paths": sum(r.full for r in records),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return CalibrationRun(bins, bins.save(out), records)


def bins_table(bins: PathEntropyBins, depth: int = 5, nodes: int = 64) -> str:
    """The bins as a markdown table: each one's entropy range, fitted paths and mean rank, and what HeteroSpec does
    there to a tree of `depth` and `nodes` (its depth extension and node budget)."""
    from ..policies.heterospec import depth_extension, node_budget

    gammas = HeteroSpecConfig().gammas
    rows = ["| bin | Phi(P*) | paths | mean TCR | depth | nodes |", "| --- | --- | --- | --- | --- | --- |"]
    bounds = [float("-inf"), *bins.edges, float("inf")]
    for i in range(bins.bins):
        extension = depth_extension(i, depth, gammas)
        count = bins.counts[i] if i < len(bins.counts) else 0
        mean = bins.means[i] if i < len(bins.means) else 0.0
        budget = node_budget(i, nodes, extension, gammas)
        rows.append(
            f"| B{i} | [{bounds[i]:.3f}, {bounds[i + 1]:.3f}) | {count} | {mean:.2f} | {depth + extension} | {budget} |"
        )
    return "\n".join(rows)
