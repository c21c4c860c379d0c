"""Where the bundled demo pair lives: `target/` and `draft/` beside this file, written by `vlmspec.eval.train_demo`."""

from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).parent


def demo_pair() -> tuple[str, str] | None:
    """Paths of the bundled target and draft, or None when they are not installed."""
    target, draft = DEMO_DIR / "target", DEMO_DIR / "draft"
    if (target / "config.json").exists() and (draft / "config.json").exists():
        return str(target), str(draft)
    return None
