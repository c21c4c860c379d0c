"""The rows in flight as one state (`RowsInFlight`), specified without models: what it holds for each row survives
the rows joining and leaving, and each step moves it on explicitly."""

from __future__ import annotations

import torch

from vlmspec.engine.rows import RowsInFlight
from vlmspec.engine.sequence import DecodeSettings, TokenSink

CPU = torch.device("cpu")


class Row:
    """A row as the state reads it: a sink over its prompt, its settings, its pending tokens and the tokens plain
    steps emitted since (`missed`), put after the pending ones by `catch_up`; a model drafts (no head features)."""

    def __init__(self, prompt: list[int], eos: list[int], pending: list[int], budget: int = 8):
        self.settings = DecodeSettings(max_new_tokens=budget, eos_token_ids=torch.tensor(eos), sampler=None)
        self.sink = TokenSink(torch.tensor([prompt]), self.settings, None)
        self.pending = torch.tensor(pending)
        self.pending_features = None
        self.missed: list[int] = []

    @property
    def positions(self) -> int:
        return self.sink.prompt_length + self.settings.max_new_tokens

    def catch_up(self, device: torch.device) -> bool:
        if not self.missed:
            return False
        self.pending = torch.cat([self.pending, torch.tensor(self.missed, device=device)])
        self.missed = []
        return True


def rows_of(pending: torch.Tensor, counts: list[int]) -> list[list[int]]:
    return [pending[b, :count].tolist() for b, count in enumerate(counts)]


def test_rows_that_stay_keep_their_pending_tokens_and_eos_ids_when_others_leave():
    rows = [Row([1, 2], [7], [3]), Row([4], [8, 9, 10], [5, 6]), Row([1, 1, 1], [11, 12], [2, 3, 4])]
    state = RowsInFlight.of(rows, alone=False, device=CPU)
    pending, counts = state.drafting(CPU)
    assert rows_of(pending, counts) == [[3], [5, 6], [2, 3, 4]]
    assert state.eos.tolist() == [[7, -1, -1], [8, 9, 10], [11, 12, -1]]

    staying = [rows[2], rows[0]]
    state = RowsInFlight.of(staying, alone=False, device=CPU)
    pending, counts = state.drafting(CPU)
    assert rows_of(pending, counts) == [[2, 3, 4], [3]]
    assert state.eos.tolist() == [[11, 12], [7, -1]]
    assert state.rows == staying


def test_a_commits_pending_tokens_are_what_each_row_feeds_next_then_plain_steps_tokens_follow():
    rows = [Row([1], [9], [3]), Row([2], [9], [4])]
    state = RowsInFlight.of(rows, alone=False, device=CPU)
    committed = torch.tensor([[5, 6, 0], [7, 8, 9]])
    state.committed(committed, [2, 3])
    assert [row.pending.tolist() for row in rows] == [[5, 6], [7, 8, 9]]
    pending, counts = state.drafting(CPU)
    assert pending is committed and counts == [2, 3]

    rows[0].missed = [10, 11]
    pending, counts = state.drafting(CPU)
    assert rows_of(pending, counts) == [[5, 6, 10, 11], [7, 8, 9]]


def test_the_history_is_each_rows_tokens_padded_with_its_last_and_moves_on_with_what_each_emits():
    rows = [Row([1, 2, 3], [9], [3]), Row([4], [9], [4])]
    state = RowsInFlight.of(rows, alone=True, device=CPU)
    assert state.alone
    assert state.sequences(CPU).tolist() == [[1, 2, 3], [4, 4, 4]]
    state.advance(torch.tensor([[5, 6], [7, 8]]), [1, 2])
    assert state.sequences(CPU).tolist() == [[1, 2, 3, 5], [4, 7, 8, 8]]

    state.forget_history()
    state.advance(torch.tensor([[0, 0], [0, 0]]), [2, 2])
    assert state.sequences(CPU).tolist() == [[1, 2, 3], [4, 4, 4]]
