"""How a draft is judged while it trains: on held-out items, decoding through `SpeculativeVLM` as users do (the
default policy, greedy), its acceptance length (tau) and its speed against the target's own `generate`, every output
checked against `generate`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

from ..speculative import SpeculativeVLM  # noqa: E402
from .data import TrainItem, item_inputs  # noqa: E402


@torch.no_grad()
def evaluate(
    target: PreTrainedModel, draft: PreTrainedModel, processor: Any, items: list[TrainItem], max_new_tokens: int = 64
) -> dict[str, float]:
    """Mean tau under SAGE (the trees the default drafts for one sequence; the default's gate may run a weak draft's
    steps plain, which tells nothing of it), the default policy's speedup (the items' `generate` seconds over its
    own) and the share of items whose every output equals `generate`'s."""
    default = SpeculativeVLM(target, draft, processor=processor, compile="off")
    sage = default.with_options("sage")
    device = target.get_input_embeddings().weight.device
    taus, plain, speculative, exact = [], 0.0, 0.0, 0
    for item in items:
        own = item_inputs(processor, item)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in own.items()}
        started = time.perf_counter()
        expected = target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        plain += time.perf_counter() - started
        started = time.perf_counter()
        got = default.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        speculative += time.perf_counter() - started
        by_trees = sage.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        taus.append(sage.last_stats.mean_accept_length)
        exact += bool(torch.equal(got, expected) and torch.equal(by_trees, expected))
    count = max(len(items), 1)
    return {"tau": sum(taus) / count, "speedup": plain / max(speculative, 1e-9), "exact": exact / count}


def plot_evaluations(log: Path, image: Path) -> None:
    """The held-out tau against the training step, from `log` (one JSON record a line), as a PNG."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    figure, axis = plt.subplots(figsize=(5, 3.2))
    axis.plot([r["step"] for r in records], [r["tau"] for r in records], marker="o")
    axis.set_xlabel("step")
    axis.set_ylabel("held-out tau")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(image, dpi=120)
    plt.close(figure)
