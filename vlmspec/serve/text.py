"""A choice's text as its tokens arrive, decoded incrementally: each new piece is the text of a short window of recent
tokens less the text of its start (the window gives the tokenizer the context a leading space or a merge depends
on), and a piece ending in an incomplete character waits for the tokens that complete it. The text is cut at the
first stop string (OpenAI's answers leave it out) and held back at its end while it could be the beginning of one."""

from __future__ import annotations

from typing import Any


class TextStream:
    """Text deltas of one choice: `feed` new token ids, get the text that is now certain; `finish` returns the rest."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer = tokenizer
        self.stops = stops
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False
        self._prefix = 0
        self._read = 0

    def _decode(self, final: bool) -> None:
        """Extend `text` with the tokens not read yet, unless they end inside a character (and this is not the end)."""
        start = self.tokenizer.decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        window = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(window) > len(start) and (final or not window.endswith("\ufffd")):
            self.text += window[len(start) :]
            self._prefix, self._read = self._read, len(self.ids)

    def _visible(self, final: bool) -> str:
        self._decode(final)
        cuts = [i for i in (self.text.find(s, max(0, self.sent - len(s))) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            return self.text[: min(cuts)]
        if final:
            return self.text
        held = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self.text[: max(self.sent, len(self.text) - held)]

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
