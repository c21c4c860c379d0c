"""What relaxed (lossy) verification costs in quality, measured as the field measures it: the suite's own accuracy
against its ground truth (`accuracy.py`), BLEU and ROUGE-L of each output against the target's exact output, and the
share of emitted tokens that are not the target's choice.

BLEU is sacrebleu's corpus BLEU over the suite (0-100) and ROUGE-L the mean of rouge-score's ROUGE-L F-measure per item
(scaled to 0-100), both from the optional `quality` extra (`pip install 'vlmspec[quality]'`), not hand-written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine.relaxed import RelaxedVerification
from .accuracy import score_caption, summarize
from .synthetic import Item

QUALITY_EXTRA = "pip install 'vlmspec[quality]'"


def check_quality_packages() -> None:
    """Raise an `ImportError` naming the extra when sacrebleu or rouge-score is missing."""
    try:
        import rouge_score  # noqa: F401
        import sacrebleu  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"measuring relaxed verification's quality needs sacrebleu and rouge-score: {QUALITY_EXTRA}"
        ) from error


def relaxed_method(method: str, verification: RelaxedVerification) -> str:
    """A bench row's name for `method` decoded under `verification`."""
    v = verification
    return f"{method} relaxed({v.tau_base:g},{v.gamma:g},b{v.top_beta},{v.direction})"


def output_quality(
    items: Sequence[Item], texts: Sequence[str], references: Sequence[str], differing: int, new_tokens: int
) -> dict[str, Any]:
    """One method's quality over a suite: `texts` its outputs for `items`, `references` the target's exact outputs,
    `differing` of its `new_tokens` emitted tokens not the target's choice. Shares and scores in points (0-100)."""
    from rouge_score import rouge_scorer
    from sacrebleu import corpus_bleu

    accuracy = summarize([score_caption(item, text) for item, text in zip(items, texts, strict=True)])
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge = [scorer.score(ref, text)["rougeL"].fmeasure for text, ref in zip(texts, references, strict=True)]
    return {
        "count_accuracy": 100 * accuracy["count_accuracy"],
        "pair_recall": 100 * accuracy["pair_recall"],
        "bleu": corpus_bleu(list(texts), [list(references)]).score,
        "rouge_l": 100 * sum(rouge) / len(rouge),
        "differing_tokens": differing,
        "differing_share": 100 * differing / new_tokens if new_tokens else 0.0,
    }


def quality_lines(quality: dict[str, dict[str, Any]]) -> list[str]:
    """The quality table (markdown) of every method's `output_quality`."""
    lines = [
        "",
        "Quality (points): the suite's count accuracy and colour-shape pair recall against its ground truth; BLEU and "
        "ROUGE-L against the target's exact output; the share of emitted tokens that are not the target's choice:",
        "",
        "| method | count accuracy | pair recall | BLEU | ROUGE-L | differing tokens |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, q in quality.items():
        lines.append(
            f"| {name} | {q['count_accuracy']:.1f} | {q['pair_recall']:.1f} | {q['bleu']:.1f} | {q['rouge_l']:.1f} "
            f"| {q['differing_tokens']} ({q['differing_share']:.1f}%) |"
        )
    return lines
