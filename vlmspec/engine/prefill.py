"""How prompts join a batch: the prompt passes of both models, the target over each prompt (scoring the visual tokens
for the draft's pruning on the way), then the draft over the tokens pruning leaves it; prompts of similar lengths
share one left-padded forward, and each prompt that goes on becomes a row of both runners' caches."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch

from ..adapters import VisualLayout
from ..adapters.base import FEATURE_KEY
from ..policies import TreePolicy
from ..pruning import PruningConfig, VerifierScores, scoring
from .kv_cache import PromptSlot
from .model_runner import ModelRunner
from .prefix import Continuation
from .rows import Row, RowRequest
from .stats import PhaseTimer, SpecStats


class Prefilled:
    """What both models' prompt passes leave behind: the target's last logits, the pruning that shaped the draft's
    prompt and where each model's cache holds the prompt (`target_prompt`, `draft_prompt`: None before its pass).
    Draws of one prompt admitted one after another share it while their caches still hold it (`held`)."""

    def __init__(self, target_inputs: dict[str, Any], draft_inputs: dict[str, Any]):
        self.target_inputs = target_inputs
        self.draft_inputs = draft_inputs
        self.logits = torch.empty(0)
        self.target_prompt: PromptSlot | None = None
        self.draft_prompt: PromptSlot | None = None
        self.prune = False
        self.layout: VisualLayout | None = None
        self.scores: torch.Tensor | None = None

    @property
    def drafted(self) -> bool:
        """Whether the draft's cache holds the draft's prompt (its pass ran and no later write took its slot)."""
        return self.draft_prompt is not None and self.draft_prompt.slot is not None

    @property
    def held(self) -> bool:
        """Whether the target's cache still holds the prompt, for another draw to take."""
        return self.target_prompt is not None and self.target_prompt.slot is not None


class Prefiller:
    """Prefills one prompt at a time for a pair (into the caches of the pair's target and draft runners, which decode
    the batch's rows), and holds what the pair decodes under: its policy, pruning and vocabulary limits."""

    def __init__(
        self,
        target: ModelRunner,
        draft: ModelRunner,
        policy: TreePolicy,
        vocab_limit: int,
        pruning: PruningConfig | None = None,
        draft_input_limit: int | None = None,
    ):
        self.target = target
        self.draft = draft
        self.policy = policy
        self.pruning = pruning
        self.vocab_limit = vocab_limit
        self.draft_input_limit = draft_input_limit or vocab_limit
        self._shared: tuple[dict[str, Any], Prefilled] | None = None

    def prefill_target(self, prefill: Prefilled, room: int, stats: SpecStats, timer: PhaseTimer) -> None:
        """Run the target over the prompt (with room for `room` new tokens), scoring the visual tokens for the draft's
        pruning on the way."""
        target, pruning = self.target, self.pruning
        with timer("pruning"):
            layout = target.adapter.visual_layout(prefill.target_inputs) if pruning is not None else None
            prefill.prune = layout is not None and bool(layout.mask.any())
            verifier = prefill.prune and pruning.method == "verifier"
            scorer = VerifierScores(target.adapter, layout, pruning.layers) if verifier else None
        with timer("target_prefill"), scorer or nullcontext():
            prefill.logits, prefill.target_prompt = target.prefill(prefill.target_inputs, room)
        stats.target_prefill_tokens = prefill.target_prompt.length
        if scorer is not None:
            stats.phase_seconds["target_prefill"] -= scorer.seconds
            stats.phase_seconds["pruning"] += scorer.seconds
        prefill.layout, prefill.scores = layout, None if scorer is None else scorer.scores

    def draft_keep(
        self, target_inputs: dict[str, Any], layout: VisualLayout, scores: torch.Tensor | None
    ) -> torch.Tensor:
        """Which prompt tokens the draft sees (bool over the prompt, on the draft's device): every text token and the
        visual tokens pruning keeps, chosen by the verifier's `scores` where there are some."""
        has_video = self.target.adapter.has_video(target_inputs)
        return self.pruning.keep_mask(layout, has_video, scores).to(self.draft.device)

    def prefill_draft(self, prefill: Prefilled, room: int, stats: SpecStats, timer: PhaseTimer) -> None:
        """Run the draft over the prompt (with room for `room` new tokens), keeping only the visual tokens pruning
        leaves it."""
        draft = self.draft
        keep = None
        if prefill.prune:
            with timer("pruning"):
                keep = self.draft_keep(prefill.target_inputs, prefill.layout, prefill.scores)
        with timer("draft_prefill"):
            inputs = with_features(prefill.draft_inputs, prefill.target_prompt.features)
            _, prefill.draft_prompt = draft.prefill(inputs, room, keep)
        stats.draft_prefill_tokens = prefill.draft_prompt.length

    def admit(self, requests: list[RowRequest]) -> list[tuple[RowRequest, Row | Exception]]:
        """Admit the requests joining the batch: prompts of similar lengths (of their own inputs) prefilled together
        in one padded forward of the target, the others (and any group whose forward fails) one by one, a prompt that
        cannot be prefilled failing alone. Every input reaches the models through here (the seam where fault tests
        stop a job while an input decodes)."""
        target, draft = self.target, self.draft
        admitted: list[tuple[RowRequest, Row | Exception]] = []
        alone: list[RowRequest] = []
        for group in _similar_lengths(requests):
            distinct = len({id(r.target_inputs) for r in group}) == len(group)
            fresh = all(r.settings.max_new_tokens > 0 and r.continuation is None for r in group)
            if len(group) > 1 and distinct and fresh:
                before = target.cache.rows
                generators = [r.settings.sampler.generator for r in group]
                states = [None if g is None else g.get_state() for g in generators]
                try:
                    together = self._admit_together(group)
                except Exception:  # noqa: BLE001 - inputs that cannot share a forward are prefilled one by one
                    target.discard(before)
                    draft.discard(before)
                    # Their first tokens are drawn again alone: from where their generators stood.
                    for generator, state in zip(generators, states, strict=True):
                        if generator is not None:
                            generator.set_state(state)
                else:
                    for _, row in together:
                        row.sink.follow(row.request.streamer)
                    admitted += together
                    continue
            alone += group
        for request in alone:
            rows = target.cache.rows
            try:
                admitted.append((request, self._admit(request)))
            except Exception as error:  # noqa: BLE001 - a prompt that cannot be prefilled fails alone
                target.discard(rows)
                draft.discard(rows)
                admitted.append((request, error))
        return admitted

    def _admit_together(self, requests: list[RowRequest]) -> list[tuple[RowRequest, Row]]:
        """Prefill the target over the requests' prompts in one left-padded forward (each row's pruning scores taken
        from its own rows of it), emit each first token, then prefill the draft over the prompts that go on in one
        forward too (each row keeping its own visual tokens) and take those rows in."""
        target, draft, pruning = self.target, self.draft, self.pruning
        adapter = target.adapter
        batch = adapter.join_rows([r.target_inputs for r in requests], 0)
        lengths = [r.target_inputs["input_ids"].shape[1] for r in requests]
        pads = [batch["input_ids"].shape[1] - length for length in lengths]
        layouts = [None if pruning is None else adapter.visual_layout(r.target_inputs) for r in requests]
        prunes = [layout is not None and bool(layout.mask.any()) for layout in layouts]
        scorers = [
            VerifierScores(adapter, layout, pruning.layers, b, pads[b])
            if prunes[b] and pruning.method == "verifier"
            else None
            for b, layout in enumerate(layouts)
        ]
        started = time.perf_counter()
        with scoring(adapter, [s for s in scorers if s is not None]):
            room = max(r.settings.max_new_tokens for r in requests)
            logits, prompts = target.prefill_rows(batch, lengths, room)
        seconds = (time.perf_counter() - started) / len(requests)
        admitted, going_on = [], []
        for b, request in enumerate(requests):
            # Streamers follow the rows once the group is in (a failed group is admitted again one by one).
            row = Row(request, self.policy.for_row(), streaming=False)
            scored = 0.0 if scorers[b] is None else scorers[b].seconds
            row.stats.phase_seconds["target_prefill"] += seconds - scored
            row.stats.phase_seconds["pruning"] += scored
            row.stats.target_prefill_tokens = lengths[b]
            first = request.settings.sampler.first(logits[b], row.sink.sequence)
            row.sink.emit(first[None], logits[b])
            if not row.sink.finished:
                row.start_pending(first, prompts[b].features, draft.device)
                going_on.append(b)
            else:
                ended_at_prefill(row, target, prompts[b].slot)
            admitted.append((request, row))
        if going_on:
            keeps = [
                self._draft_keep(requests[b], layouts[b], scorers[b], admitted[b][1]) if prunes[b] else None
                for b in going_on
            ]
            features = [prompts[b].features for b in going_on]
            drafting = [requests[b] for b in going_on]
            drafts = self.prefill_drafts(drafting, keeps, [admitted[b][1] for b in going_on], features)
            for b in going_on:
                target.take(prompts[b], requests[b].settings.max_new_tokens)
            for prompt, b in zip(drafts, going_on, strict=True):
                draft.take(prompt, requests[b].settings.max_new_tokens)
                admitted[b][1].draft_prompt = prompt.length
        return admitted

    def _draft_keep(
        self, request: RowRequest, layout: VisualLayout, scorer: VerifierScores | None, row: Row
    ) -> torch.Tensor:
        """Which of the request's prompt tokens its pruned draft prompt keeps (bool over its prompt)."""
        started = time.perf_counter()
        keep = self.draft_keep(request.target_inputs, layout, None if scorer is None else scorer.scores)
        row.stats.phase_seconds["pruning"] += time.perf_counter() - started
        return keep

    def prefill_drafts(
        self,
        requests: list[RowRequest],
        keeps: list[torch.Tensor | None],
        rows: list[Row],
        features: list[torch.Tensor | None] | None = None,
    ) -> list[PromptSlot]:
        """Prefill the draft over the requests' prompts, each cut to its `keeps`, in one left-padded forward (a head
        reading the target's `features` of each prompt); returns the prompts as written into the draft's cache."""
        draft = self.draft
        features = features or [None] * len(requests)
        inputs = [with_features(r.draft_inputs, f) for r, f in zip(requests, features, strict=True)]
        batch = draft.adapter.join_rows(inputs, 0)
        width = batch["input_ids"].shape[1]
        pads = [width - r.draft_inputs["input_ids"].shape[1] for r in requests]
        keep = None
        if any(k is not None for k in keeps):
            keep = torch.zeros(batch["input_ids"].shape, dtype=torch.bool, device=batch["input_ids"].device)
            for b, (pad, own) in enumerate(zip(pads, keeps, strict=True)):
                keep[b, pad:] = True if own is None else own
        counts = [width - pad for pad in pads] if keep is None else keep.sum(1).tolist()
        room = max(r.settings.max_new_tokens for r in requests)
        started = time.perf_counter()
        _, prompts = draft.prefill_rows(batch, counts, room, keep)
        seconds = (time.perf_counter() - started) / len(requests)
        for row, count in zip(rows, counts, strict=True):
            row.stats.phase_seconds["draft_prefill"] += seconds
            row.stats.draft_prefill_tokens = count
        return prompts

    def _admit(self, request: RowRequest) -> Row:
        """Prefill a request alone (both models, pruning by its own verifier scores), emit its first token and, unless
        that ends it, make its prompts rows of the batch's caches. Requests sharing their inputs (several draws of one
        prompt, one after another) share one prefill while the caches hold its prompts (a draw copies them)."""
        target, draft, settings = self.target, self.draft, request.settings
        row = Row(request, self.policy.for_row())
        if row.sink.finished:
            return row
        if request.continuation is not None:
            return self._admit_continued(row, request.continuation)
        timer = PhaseTimer(row.stats, target.device)
        shared = self._shared
        if shared is not None and shared[0] is request.target_inputs and shared[1].held:
            prefill = shared[1]
        else:
            self._shared = None
            prefill = Prefilled(request.target_inputs, request.draft_inputs)
            self.prefill_target(prefill, settings.max_new_tokens, row.stats, timer)
            self._shared = (request.target_inputs, prefill)
        first = settings.sampler.first(prefill.logits, row.sink.sequence)
        row.sink.emit(first[None], prefill.logits)
        if row.sink.finished:
            return ended_at_prefill(row, target, prefill.target_prompt.slot)
        if not prefill.drafted:
            self.prefill_draft(prefill, settings.max_new_tokens, row.stats, timer)
        timer.collect(wait=True)
        target.take(prefill.target_prompt, settings.max_new_tokens)
        draft.take(prefill.draft_prompt, settings.max_new_tokens)
        row.draft_prompt = prefill.draft_prompt.length
        row.start_pending(first, prefill.target_prompt.features, draft.device)
        return row

    def _admit_continued(self, row: Row, continuation: Continuation) -> Row:
        """Admit a sequence that goes on from what its models hold of its inputs' first tokens: the target runs the
        rest after its prefix, as `generate` runs the uncached part of its inputs; the draft after its own prefix
        where it has one, else over all of the tokens (its inputs carry no visual ones then); a head over the
        target's features of the tokens the target ran."""
        target, draft, request = self.target, self.draft, row.request
        room, timer = request.settings.max_new_tokens, PhaseTimer(row.stats, target.device)
        ids, cached = request.target_inputs["input_ids"], continuation.target
        with timer("target_prefill"):
            logits, target_prompt = target.prefill_continued(ids[:, cached.covers :], cached, room)
        row.stats.target_prefill_tokens = ids.shape[1] - cached.covers
        first = request.settings.sampler.first(logits, row.sink.sequence)
        row.sink.emit(first[None], logits)
        if row.sink.finished:
            return ended_at_prefill(row, target, target_prompt.slot)
        own = continuation.draft
        with timer("draft_prefill"):
            draft_prompt = draft.continue_draft(request.draft_inputs, own, room, cached, target_prompt.features)
        row.stats.draft_prefill_tokens = draft_prompt.length - (0 if own is None else own.length)
        timer.collect(wait=True)
        target.take(target_prompt, room)
        draft.take(draft_prompt, room)
        row.draft_prompt = draft_prompt.length
        row.start_pending(first, target_prompt.features, draft.device)
        return row

    def release(self) -> None:
        """Let go of both runners' rows and caches (a fixed cache's buffers stay for the next batch's graphs) and the
        last prompt's shared prefill."""
        self._shared = None
        self.target.release()
        self.draft.release()


def with_features(inputs: dict[str, Any], features: torch.Tensor | None) -> dict[str, Any]:
    """A draft's prompt inputs with the target's `features` of the prompt (L, 3H) where its pass kept them (for a
    draft head); as they are otherwise."""
    if features is None:
        return inputs
    return {**inputs, FEATURE_KEY: features[None].to(inputs["input_ids"].device)}


#: The most padding a batched prefill may carry, as a share of its prompts' own tokens (a padded token costs what a
#: real one does once the forward is compute-bound).
PREFILL_PADDING = 0.25


def _similar_lengths(requests: list[RowRequest]) -> list[list[RowRequest]]:
    """The requests in groups of similar prompt lengths (by length), each padded to its longest by at most
    `PREFILL_PADDING` of its own tokens."""
    groups: list[list[RowRequest]] = []
    tokens = 0
    for request in sorted(requests, key=lambda r: r.target_inputs["input_ids"].shape[1]):
        length = request.target_inputs["input_ids"].shape[1]
        if groups and length * (len(groups[-1]) + 1) <= (1 + PREFILL_PADDING) * (tokens + length):
            groups[-1].append(request)
            tokens += length
        else:
            groups.append([request])
            tokens = length
    return groups


def ended_at_prefill(row: Row, target: ModelRunner, slot: int) -> Row:
    """A row whose first token ended it, keeping what the target's prompt pass wrote in `slot` where its settings
    return the cache (the draft never read it)."""
    if row.settings.return_cache:
        row.cache = continuation_of(row, target, slot)
    return row


def continuation_of(row: Row, target: ModelRunner, slot: int, draft: ModelRunner | None = None) -> Continuation:
    """What the models hold of `row`'s sequence at its end, all but its last token (as `generate`'s cache): the
    target's from `slot`, and with `draft` (the row then in flight) the draft's from the same slot, cut where the
    draft went past where the sequence stopped. The draft's entries past its prompt are the sequence's tokens after
    the prompt."""
    covers = row.own_tokens - 1
    own = target.prefix_of(slot, covers, covers)
    if draft is None:
        return Continuation(own)
    prompt = row.request.target_inputs["input_ids"].shape[1]
    entries = min(draft.lengths[slot], row.draft_prompt + covers - prompt)
    return Continuation(own, draft.prefix_of(slot, entries, prompt + entries - row.draft_prompt))
