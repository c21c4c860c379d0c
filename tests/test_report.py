"""The end of a step on the device: the tokens to emit, EOS and the budget settled there, and one read for the host."""

from __future__ import annotations

import torch
from one_tree import accept_greedy, emitted_tokens, made_tree

from vlmspec.engine.acceptance import pack_rows, read_rows
from vlmspec.eval.profile import LaunchCounter

EOS = torch.tensor([99])


def chain_tree(tokens: list[int]):
    """root(10) followed by a chain of `tokens`."""
    return made_tree(10, list(range(len(tokens))), tokens, [-0.1] * len(tokens))


def read(tree, verdict, tokens, eos, room, greedy_depth, statistics=None, with_tree=False):
    """Pack one tree's step on the device and read it once, as a step does for all its rows."""
    trees, rows_statistics = tree.rows(), None if statistics is None else statistics[None]
    eos_rows = eos[None]
    packed = pack_rows(
        trees, verdict.as_rows(), tokens[None], eos_rows, [room], greedy_depth[None], rows_statistics, with_tree
    )
    return read_rows(packed, trees, tokens[None], with_tree)[0]


def settle(tokens: list[int], choice: list[int], room: int = 100, **kwargs):
    tree = chain_tree(tokens)
    verdict = accept_greedy(tree, torch.tensor(choice))
    emitted = emitted_tokens(tree, verdict)
    return emitted, read(tree, verdict, emitted, EOS, room, torch.tensor(0), **kwargs)


def test_the_accepted_draft_tokens_come_first_then_the_bonus_token():
    emitted, report = settle([11, 12, 13], choice=[11, 12, 55, 0])
    assert emitted[:3].tolist() == [11, 12, 55]
    assert (report.accepted, report.count, report.finished) == (2, 3, False)
    assert report.tokens[: report.count] == [11, 12, 55] and report.path == [0, 1, 2]


def test_emission_stops_after_the_first_eos():
    _, report = settle([11, 99, 13], choice=[11, 99, 13, 7])
    assert (report.accepted, report.count, report.finished) == (3, 2, True)
    assert report.tokens[: report.count] == [11, 99]


def test_an_eos_bonus_token_ends_decoding():
    _, report = settle([11, 12], choice=[11, 99, 0])
    assert (report.count, report.finished) == (2, True)


def test_emission_stops_at_the_budget():
    _, report = settle([11, 12, 13], choice=[11, 12, 13, 14], room=2)
    assert (report.accepted, report.count, report.finished) == (3, 2, True)


def test_filling_the_budget_exactly_finishes():
    _, report = settle([11], choice=[11, 12], room=2)
    assert (report.count, report.finished) == (2, True)


def test_policy_statistics_and_the_tree_come_back_with_the_step():
    _, report = settle([11, 12], choice=[11, 5, 0], statistics=torch.tensor([0.25]), with_tree=True)
    assert report.statistics == [0.25]
    assert report.tree_parents == [-1, 0, 1]
    assert report.tree_log_probs == [0.0, torch.tensor(-0.1).item(), torch.tensor(-0.1).item()]


def test_a_step_reads_the_device_once():
    tree = chain_tree([11, 12, 13])
    counter = LaunchCounter(torch.nn.Identity())
    with counter.counting():
        verdict = accept_greedy(tree, torch.tensor([11, 12, 5, 0]))
        emitted = emitted_tokens(tree, verdict)
        read(tree, verdict, emitted, EOS, 10, torch.tensor(1), torch.tensor([0.5]), with_tree=True)
    assert counter.reads["own"] == 1
