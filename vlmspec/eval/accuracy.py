"""How well a caption describes its item: counts, colours, shapes and colour-shape pairs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .synthetic import COLOURS, NUMBERS, SHAPES, SIZES, Item

_PAIR = re.compile(rf"\b({'|'.join(COLOURS)})\s+(?:(?:{'|'.join(SIZES)})\s+)?({'|'.join(SHAPES)})\b")
_COUNT = re.compile(rf"\b({'|'.join(NUMBERS)})\s+(?:coloured\s+)?(?:shapes|objects)\b")


@dataclass
class CaptionScore:
    count_correct: bool
    colour_recall: float
    shape_recall: float
    pair_recall: float
    pair_precision: float


def mentioned_pairs(text: str) -> list[tuple[str, str]]:
    """(colour, shape) pairs the caption names ("a large red circle", "a red circle", "you can see a red circle")."""
    return [(m.group(1), m.group(2)) for m in _PAIR.finditer(text)]


def score_caption(item: Item, text: str) -> CaptionScore:
    """Recall of the scene's colours, shapes and colour-shape pairs in `text`, and whether the count is right."""
    truth = [(s.colour, s.shape) for s in item.shapes]
    said = mentioned_pairs(text)
    count = _COUNT.search(text)
    remaining = list(said)
    hits = 0
    for pair in truth:
        if pair in remaining:
            remaining.remove(pair)
            hits += 1
    said_colours = [c for c, _ in said]
    said_shapes = [s for _, s in said]
    return CaptionScore(
        count_correct=bool(count) and count.group(1) == NUMBERS[len(truth)],
        colour_recall=sum(c in said_colours for c, _ in truth) / len(truth),
        shape_recall=sum(s in said_shapes for _, s in truth) / len(truth),
        pair_recall=hits / len(truth),
        pair_precision=hits / len(said) if said else 0.0,
    )


def summarize(scores: list[CaptionScore]) -> dict[str, float]:
    """Means over items, as shares in [0, 1]."""
    n = max(1, len(scores))
    return {
        "count_accuracy": sum(s.count_correct for s in scores) / n,
        "colour_recall": sum(s.colour_recall for s in scores) / n,
        "shape_recall": sum(s.shape_recall for s in scores) / n,
        "pair_recall": sum(s.pair_recall for s in scores) / n,
        "pair_precision": sum(s.pair_precision for s in scores) / n,
    }
