"""A choice's text as its tokens arrive: decoded whole each time (so multi-byte characters split across tokens come
out whole), cut at the first stop string (OpenAI's answers leave it out), and held back at the end while it could be
the beginning of a stop string or of a character."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Text deltas of one choice: `feed` new token ids, get the text that is now certain; `finish` returns the rest."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer = tokenizer
        self.stops = stops
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def _visible(self, final: bool) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            return text[: min(cuts)]
        if final:
            return text
        text = text.rstrip("\ufffd")
        held = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[: max(self.sent, len(text) - held)]

    def feed(self, ids: list[int]) -> str:
        if self.stopped:
            return ""
        self.ids += ids
        return self._delta(self._visible(final=False))

    def finish(self) -> str:
        if self.stopped:
            return ""
        return self._delta(self._visible(final=True))

    def _delta(self, visible: str) -> str:
        delta = visible[self.sent :]
        self.sent = max(self.sent, len(visible))
        return delta
