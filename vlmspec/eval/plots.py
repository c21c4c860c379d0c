"""The benchmark's figures: speedup by method, tau distribution, entropy autocorrelation, SAGE's tree shapes, and
the cost model's predictions against what happened."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@contextmanager
def _figure(path: Path, title: str, size: tuple[float, float] = (6, 3.5)) -> Iterator[Any]:
    """Axes to draw on; the figure is titled, laid out, saved to `path` and closed afterwards."""
    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def plot_all(results: dict[str, Any], out: Path) -> None:
    methods = results["methods"]
    names = list(methods)
    with _figure(out / "speedup.png", f"{results['suite']} suite: tokens/s relative to greedy generate") as ax:
        ax.bar(names, [methods[m]["speedup"] for m in names], color="tab:blue")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel("speedup vs ar")

    taus = results["tau_per_item"]
    with _figure(out / "tau_distribution.png", "acceptance length per item") as ax:
        ax.boxplot(list(taus.values()), tick_labels=list(taus))
        ax.set_ylabel("tau (accepted draft tokens per step)")

    corr = results["entropy_autocorrelation"]
    with _figure(out / "entropy_autocorrelation.png", "autocorrelation of the target's top-10 entropy") as ax:
        ax.bar(range(1, len(corr) + 1), corr, color="tab:green")
        ax.set_xlabel("lag (decoding steps)")
        ax.set_ylabel("Pearson correlation")

    steps = results["sage_steps"]
    if steps:
        with _figure(out / "sage_steps.png", "SAGE: tree shape per step (first item)", size=(7, 3.5)) as ax:
            x = range(1, len(steps) + 1)
            ax.plot(x, [s["depth"] for s in steps], label="planned depth D")
            ax.plot(x, [s["width"] for s in steps], label="width W")
            ax.plot(x, [s["accepted"] for s in steps], label="accepted", linestyle=":")
            ax.set_xlabel("step")
            ax.legend()

    for name, cost_steps in results.get("cost_model_steps", {}).items():
        if cost_steps:
            plot_cost_model(name, cost_steps, out / f"cost_model_{name}.png")


def plot_cost_model(name: str, steps: list[dict[str, Any]], path: Path) -> None:
    """Predicted against observed tokens per step and milliseconds per step, one point per step."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    try:
        panels = (
            ("tokens per step", [s["predicted_tokens"] for s in steps], [s["accepted"] + 1 for s in steps]),
            (
                "drafting + verification ms per step",
                [1000 * s["predicted_seconds"] for s in steps],
                [1000 * s["seconds"] for s in steps],
            ),
        )
        for ax, (label, predicted, observed) in zip(axes, panels, strict=True):
            ax.scatter(predicted, observed, s=8, alpha=0.5)
            top = max(max(predicted), max(observed)) * 1.05
            ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
            ax.set_xlim(0, top)
            ax.set_ylim(0, top)
            ax.set_xlabel(f"predicted {label}")
            ax.set_ylabel(f"observed {label}")
        fig.suptitle(f"{name}: cost model, predicted before each step vs observed")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
