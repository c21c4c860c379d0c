"""The benchmark's figures: speedup by method, tau distribution, entropy autocorrelation, SAGE's tree shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_all(results: dict[str, Any], out: Path) -> None:
    methods = results["methods"]
    names = list(methods)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [methods[m]["speedup"] for m in names], color="tab:blue")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("speedup vs ar")
    ax.set_title(f"{results['suite']} suite: tokens/s relative to greedy generate")
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)

    taus = results["tau_per_item"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot(list(taus.values()), tick_labels=list(taus))
    ax.set_ylabel("tau (accepted draft tokens per step)")
    ax.set_title("acceptance length per item")
    fig.tight_layout()
    fig.savefig(out / "tau_distribution.png", dpi=120)
    plt.close(fig)

    corr = results["entropy_autocorrelation"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(corr) + 1), corr, color="tab:green")
    ax.set_xlabel("lag (decoding steps)")
    ax.set_ylabel("Pearson correlation")
    ax.set_title("autocorrelation of the target's top-10 entropy")
    fig.tight_layout()
    fig.savefig(out / "entropy_autocorrelation.png", dpi=120)
    plt.close(fig)

    steps = results["sage_steps"]
    if steps:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = range(1, len(steps) + 1)
        ax.plot(x, [s["depth"] for s in steps], label="planned depth D")
        ax.plot(x, [s["width"] for s in steps], label="width W")
        ax.plot(x, [s["accepted"] for s in steps], label="accepted", linestyle=":")
        ax.set_xlabel("step")
        ax.set_title("SAGE: tree shape per step (first item)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "sage_steps.png", dpi=120)
        plt.close(fig)
