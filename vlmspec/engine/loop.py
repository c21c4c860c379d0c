"""The decoding loop: prefill both models, then draft -> verify -> accept -> update until EOS or the token budget."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..adapters import VisualLayout
from ..policies import BatchShape, StepOutcome, TreePlan, TreePolicy
from ..pruning import PruningConfig, VerifierScores
from .choice import NodeProcessing, TargetSampler
from .commit import plan_commit
from .counting import host_values
from .draft import Drafted, Drafter
from .report import StepReport
from .rows_step import RowsDrafted, accept_all
from .runner import ModelRunner
from .stats import PhaseTimer, SpecStats, StepRecord
from .tree import DraftTree
from .verify import verify_tree


@dataclass
class DecodeSettings:
    """What stops and shapes decoding: the token budget, EOS ids, the target's sampler and the draft's processing.

    `draft_processing` holds the config's processors (repetition penalty, ..., and the warpers when the target
    samples) for the draft's proposals, so it proposes what the processed target chooses; None when there are none.
    `num_sequences` continuations are drawn from one prefill; shorter ones are padded with `pad_token_id`.
    """

    max_new_tokens: int
    eos_token_ids: torch.Tensor
    sampler: TargetSampler
    draft_processing: NodeProcessing | None = None
    num_sequences: int = 1
    pad_token_id: int | None = None

    def for_row(self, row: int) -> DecodeSettings:
        """The settings of row `row` of the padded batch they were resolved for (processors that hold a value per
        row take that row's)."""
        sampler = self.sampler.for_row(row)
        if sampler is self.sampler:
            return self
        processing = None if self.draft_processing is None else self.draft_processing.for_row(row)
        return replace(self, sampler=sampler, draft_processing=processing)


class TokenSink:
    """Collects emitted tokens after the prompt, cuts at EOS and at the budget, and feeds a streamer.

    Tokens taken `on_device=False` are kept as the host's copy of the step's read and written to the device in one
    copy when the sequence is next asked for: a batch whose rows' sequences nothing reads during decoding (no logits
    processors) writes each row's tokens once, at its end, not once per step.
    """

    def __init__(self, prompt: torch.Tensor, settings: DecodeSettings, streamer: Any):
        self.settings = settings
        self.streamer = streamer
        self.buffer = torch.empty(1, prompt.shape[1] + settings.max_new_tokens, dtype=torch.long, device=prompt.device)
        self.buffer[:, : prompt.shape[1]] = prompt
        self.length = prompt.shape[1]
        self.prompt_length = prompt.shape[1]
        self.finished = settings.max_new_tokens <= 0
        self._host: list[int] = []
        if streamer is not None:
            streamer.put(prompt.cpu())

    @property
    def sequence(self) -> torch.Tensor:
        self._write_host()
        return self.buffer[:, : self.length]

    def _write_host(self) -> None:
        """Write the tokens kept on the host into the device's buffer."""
        if self._host:
            start = self.length - len(self._host)
            self.buffer[0, start : self.length] = host_values(self._host, self.buffer.device)
            self._host = []

    @property
    def new_tokens(self) -> int:
        return self.length - self.prompt_length

    @property
    def room(self) -> int:
        """Tokens the budget still allows."""
        return self.settings.max_new_tokens - self.new_tokens

    def take(self, tokens: torch.Tensor, report: StepReport, on_device: bool = True) -> None:
        """Append the first `report.count` of a step's `tokens` (on the device), as its report settled them: copied
        on the device, or (`on_device=False`) kept from the report's host copy until the sequence is asked for."""
        if on_device:
            self._write_host()
            self.buffer[0, self.length : self.length + report.count] = tokens[: report.count]
        else:
            self._host += report.tokens[: report.count]
        self.length += report.count
        self.finished = report.finished
        if self.streamer is not None and report.count:
            self.streamer.put(torch.tensor(report.tokens[: report.count]))

    def emit(self, tokens: torch.Tensor) -> None:
        """Append `tokens` (k,), stopping after the first EOS or when `max_new_tokens` is reached."""
        self._write_host()
        room = self.room
        is_eos = torch.isin(tokens, self.settings.eos_token_ids)
        if bool(is_eos.any()):
            tokens = tokens[: int(is_eos.int().argmax()) + 1]
            self.finished = True
        if tokens.shape[0] >= room:
            tokens = tokens[:room]
            self.finished = True
        self.buffer[0, self.length : self.length + tokens.shape[0]] = tokens
        self.length += tokens.shape[0]
        if self.streamer is not None and tokens.shape[0]:
            self.streamer.put(tokens.cpu())

    def close(self) -> None:
        if self.streamer is not None:
            self.streamer.end()


class Prefilled:
    """What both models' prompt passes leave behind: the target's last logits and the pruning that shaped the draft's
    prompt. Draws of one prompt admitted one after another share it (`drafted` says the draft's pass ran)."""

    def __init__(self, target_inputs: dict[str, Any], draft_inputs: dict[str, Any], room: int):
        self.target_inputs = target_inputs
        self.room = room
        self.draft_inputs = draft_inputs
        self.logits = torch.empty(0)
        self.drafted = False
        self.prune = False
        self.layout: VisualLayout | None = None
        self.scores: torch.Tensor | None = None


class SpeculativeDecoder:
    """Lossless tree speculative decoding of one prompt with a target, a draft and a tree policy."""

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
        self.drafter = Drafter(draft, vocab_limit, draft_input_limit or vocab_limit)

    def run(
        self,
        target_inputs: dict[str, Any],
        draft_inputs: dict[str, Any],
        settings: DecodeSettings,
        streamer: Any = None,
    ) -> tuple[torch.Tensor, SpecStats]:
        """Generate one continuation of one prompt; returns the prompt followed by its new tokens (1, L + n) and the
        call's statistics. Several draws of a prompt (`num_sequences`) decode together, as a batch's rows."""
        started = time.perf_counter()
        stats = SpecStats()
        timer = PhaseTimer(stats, self.target.device)
        sink = TokenSink(target_inputs["input_ids"], settings, streamer)
        try:
            if not sink.finished:
                self._decode(
                    Prefilled(target_inputs, draft_inputs, settings.max_new_tokens), settings, sink, stats, timer
                )
        finally:
            sink.close()
        stats.new_tokens = sink.new_tokens
        timer.collect(wait=True)
        stats.finish(time.perf_counter() - started)
        return sink.sequence, stats

    def prefill_target(self, prefill: Prefilled, stats: SpecStats, timer: PhaseTimer) -> None:
        """Run the target over the prompt, scoring the visual tokens for the draft's pruning on the way."""
        target, pruning = self.target, self.pruning
        with timer("pruning"):
            layout = target.adapter.visual_layout(prefill.target_inputs) if pruning is not None else None
            prefill.prune = layout is not None and bool(layout.mask.any())
            verifier = prefill.prune and pruning.method == "verifier"
            scorer = VerifierScores(target.adapter, layout, pruning.layers) if verifier else None
        with timer("target_prefill"), scorer or nullcontext():
            prefill.logits = target.prefill(prefill.target_inputs, room=prefill.room)
        with timer("target_prefill"):
            target.check_compiled(prefill.logits)
        stats.target_prefill_tokens = target.length
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

    def prefill_draft(self, prefill: Prefilled, stats: SpecStats, timer: PhaseTimer) -> None:
        """Run the draft over the prompt, keeping only the visual tokens pruning leaves it."""
        draft = self.draft
        keep = None
        if prefill.prune:
            with timer("pruning"):
                keep = self.draft_keep(prefill.target_inputs, prefill.layout, prefill.scores)
        with timer("draft_prefill"):
            draft.check_compiled(draft.prefill(prefill.draft_inputs, keep, room=prefill.room))
        prefill.drafted = True
        stats.draft_prefill_tokens = draft.length

    def _decode(
        self, prefill: Prefilled, settings: DecodeSettings, sink: TokenSink, stats: SpecStats, timer: PhaseTimer
    ) -> None:
        target, draft, policy = self.target, self.draft, self.policy
        self.prefill_target(prefill, stats, timer)
        with timer("acceptance"):
            first = settings.sampler.first(prefill.logits, sink.sequence)
        sink.emit(first[None])
        if sink.finished:
            return
        self.prefill_draft(prefill, stats, timer)
        policy.reset()
        pending = first[None].to(draft.device)
        while not sink.finished:
            step_started = time.perf_counter()
            plan = policy.plan()
            draft_start, target_start = draft.length, target.length
            with timer("drafting"):
                depth = settings.max_new_tokens - sink.new_tokens - 1
                drafted = self.drafter.grow(pending, plan, sink.sequence, settings.draft_processing, depth)
            tree = drafted.tree.to(target.device)
            with timer("verification"):
                logits = verify_tree(target, tree)
            with timer("acceptance"):
                tokens, report = self._accept(settings, tree, logits, drafted, sink)
                timer.collect()
            with timer("tree_update"):
                fed_pending = pending.shape[0]
                pending = self._commit(report, drafted, target_start, draft_start, fed_pending)
                contexts = (draft_start + fed_pending, target_start)
                observe_step(policy, plan, drafted, tree, report, stats, timer, step_started, contexts)
                sink.take(tokens, report)

    def _accept(
        self, settings: DecodeSettings, tree: DraftTree, logits: torch.Tensor, drafted: Drafted, sink: TokenSink
    ) -> tuple[torch.Tensor, StepReport]:
        """Accept on the device and read the step's results once (`accept_all` over a batch of one): the tokens it
        emits and its report; a sampled verdict in doubt is drawn again from the full rows (a second read, only
        then)."""
        one = RowsDrafted.one(drafted)
        accepted = accept_all(
            one,
            tree.rows(),
            logits[None],
            [settings.sampler],
            [sink.sequence],
            settings.eos_token_ids[None],
            [sink.room],
            self.policy.statistics(one.root_log_probs),
            self.policy.reads_tree,
        )
        return accepted.tokens[0], accepted.reports[0]

    def _commit(
        self, report: StepReport, drafted: Drafted, target_start: int, draft_start: int, fed_pending: int
    ) -> torch.Tensor:
        """Keep the accepted path in both caches; returns the tokens the draft has not seen yet (the accepted ones
        deeper than the levels it was fed, then the bonus token)."""
        plan = plan_commit(
            [report], [fed_pending], [drafted.cached_depth], [drafted.slots], self.target.device, self.draft.device
        )
        target, draft, pending = plan.row(0)
        self.target.keep(target_start, target)
        self.draft.keep(draft_start, draft)
        return pending


def observe_step(
    policy: TreePolicy,
    plan: TreePlan,
    drafted: Drafted,
    tree: DraftTree,
    report: StepReport,
    stats: SpecStats,
    timer: PhaseTimer,
    step_started: float,
    contexts: tuple[int, int],
    batch: BatchShape | None = None,
) -> None:
    """The one observer of a finished step: the policy learns from it and `stats` records it. `contexts` are the
    draft's and the target's cache lengths the step's forwards ran over; `batch` what the whole step fed and emitted
    when the sequence decoded among others (their step times are its times), None when it decoded alone."""
    policy.observe(
        StepOutcome(
            root_log_probs=drafted.root_log_probs,
            accepted=report.accepted,
            tree=drafted.tree,
            path=report.path,
            draft_forwards=drafted.forwards,
            draft_tokens=drafted.fed_tokens,
            draft_context=contexts[0],
            target_context=contexts[1],
            draft_seconds=timer.last["drafting"],
            verify_seconds=timer.last["verification"],
            seconds=time.perf_counter() - step_started,
            statistics=report.statistics,
            tree_parents=report.tree_parents,
            tree_log_probs=report.tree_log_probs,
            batch=batch,
        )
    )
    predicted = policy.prediction
    stats.steps.append(
        StepRecord(
            alpha=policy.confidence,
            depth=plan.depth,
            width=plan.width,
            nodes=tree.size - 1,
            accepted=report.accepted,
            tree_depth=tree.depth,
            greedy_depth=report.greedy_depth,
            seconds=timer.last["drafting"] + timer.last["verification"],
            predicted_tokens=None if predicted is None else predicted[0],
            predicted_seconds=None if predicted is None else predicted[1],
        )
    )
