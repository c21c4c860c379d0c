"""Where the bundled demo models live: `target/` and `draft/` beside this file, written by `vlmspec.eval.train_demo`,
and `head/`, a draft head for the target trained by `vlmspec train-draft --kind head` (see docs/training.md)."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).parent


def demo_pair() -> tuple[str, str] | None:
    """Paths of the bundled target and draft, or None when they are not installed."""
    target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    if (target / "config.json").exists() and (draft / "config.json").exists():
        return str(target), str(draft)
    return None


def demo_head() -> str | None:
    """Path of the bundled draft head for the demo target, or None when it is not installed."""
    head = DEMO_DIR / "head"
    return str(head) if (head / "config.json").exists() else None
