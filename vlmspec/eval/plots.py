"""The benchmark's figures: speedup by method, tau distribution, entropy autocorrelation, SAGE's tree shapes."""

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
