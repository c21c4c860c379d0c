"""The decoding loop: prefill both models, then draft -> verify -> accept -> update until EOS or the token budget."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..policies import TreePolicy
from ..pruning import PruningConfig, VerifierScores
from .choice import NodeProcessing, TargetChoice
from .draft import Drafter
from .runner import ModelRunner
from .stats import PhaseTimer, SpecStats, StepRecord
from .verify import accept_greedy, verify_tree


@dataclass
class DecodeSettings:
    """What stops and shapes decoding: the token budget, EOS ids, the target's choice and the draft's processing.

    `draft_processing` holds the config's sequence processors (repetition penalty, ...) for the draft's
    proposals, so it proposes what the processed target chooses; None when the config has none.
    """

    max_new_tokens: int
    eos_token_ids: torch.Tensor
    choice: TargetChoice
    draft_processing: NodeProcessing | None = None


class TokenSink:
    """Collects emitted tokens after the prompt, cuts at EOS and at the budget, and feeds a streamer."""

    def __init__(self, prompt: torch.Tensor, settings: DecodeSettings, streamer: Any):
        self.settings = settings
        self.streamer = streamer
        self.buffer = torch.empty(1, prompt.shape[1] + settings.max_new_tokens, dtype=torch.long, device=prompt.device)
        self.buffer[:, : prompt.shape[1]] = prompt
        self.length = prompt.shape[1]
        self.prompt_length = prompt.shape[1]
        self.finished = settings.max_new_tokens <= 0
        if streamer is not None:
            streamer.put(prompt.cpu())

    @property
    def sequence(self) -> torch.Tensor:
        return self.buffer[:, : self.length]

    @property
    def new_tokens(self) -> int:
        return self.length - self.prompt_length

    def emit(self, tokens: torch.Tensor) -> None:
        """Append `tokens` (k,), stopping after the first EOS or when `max_new_tokens` is reached."""
        room = self.settings.max_new_tokens - self.new_tokens
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


class SpeculativeDecoder:
    """Lossless tree speculative decoding of one sequence with a target, a draft and a tree policy."""

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
        """Generate; returns the prompt followed by the new tokens (1, L + n) and the call's statistics."""
        started = time.perf_counter()
        stats = SpecStats()
        timer = PhaseTimer(stats, self.target.device)
        sink = TokenSink(target_inputs["input_ids"], settings, streamer)
        try:
            if not sink.finished:
                self._decode(target_inputs, draft_inputs, settings, sink, stats, timer)
        finally:
            sink.close()
        stats.new_tokens = sink.new_tokens
        stats.finish(time.perf_counter() - started)
        return sink.sequence, stats

    def _decode(self, target_inputs, draft_inputs, settings, sink, stats, timer) -> None:
        target, draft, policy, pruning = self.target, self.draft, self.policy, self.pruning
        with timer("pruning"):
            layout = target.adapter.visual_layout(target_inputs) if pruning is not None else None
            prune = layout is not None and bool(layout.mask.any())
            verifier = prune and pruning.method == "verifier"
            scorer = VerifierScores(target.adapter, layout, pruning.layers) if verifier else None
        with timer("target_prefill"), scorer or nullcontext():
            logits = target.prefill(target_inputs)
            first = settings.choice.first(logits, sink.sequence)
        stats.target_prefill_tokens = target.length
        if scorer is not None:
            stats.phase_seconds["target_prefill"] -= scorer.seconds
            stats.phase_seconds["pruning"] += scorer.seconds
        sink.emit(first[None])
        if sink.finished:
            return
        keep = None
        if prune:
            with timer("pruning"):
                has_video = target_inputs.get("pixel_values_videos") is not None
                keep = pruning.keep_mask(layout, has_video, None if scorer is None else scorer.scores).to(draft.device)
        with timer("draft_prefill"):
            draft.prefill(draft_inputs, keep)
        stats.draft_prefill_tokens = draft.length
        policy.reset()
        pending = first[None].to(draft.device)
        while not sink.finished:
            plan = policy.plan()
            draft_start = draft.length
            with timer("drafting"):
                drafted = self.drafter.grow(pending, plan, sink.sequence, settings.draft_processing)
            tree = drafted.tree.to(target.device)
            target_start = target.length
            with timer("verification"):
                target_choice = verify_tree(target, tree, settings.choice, sink.sequence)
            with timer("tree_update"):
                path, bonus = accept_greedy(tree, target_choice)
                accepted_nodes = path[1:]
                target.keep(target_start, path)
                in_draft = (accepted_nodes <= drafted.cached_nodes).to(draft.device)
                draft_path = accepted_nodes.to(draft.device)
                root_offset = pending.shape[0] - 1
                draft.keep(
                    draft_start,
                    torch.cat(
                        [torch.arange(pending.shape[0], device=draft.device), draft_path[in_draft] + root_offset]
                    ),
                )
                pending = torch.cat([drafted.tree.tokens[draft_path[~in_draft]], bonus[None].to(draft.device)])
                stats.steps.append(
                    StepRecord(
                        alpha=policy.confidence,
                        depth=plan.depth,
                        width=plan.width,
                        nodes=tree.size - 1,
                        accepted=accepted_nodes.shape[0],
                        tree_depth=tree.depth,
                        greedy_depth=drafted.greedy_depth,
                    )
                )
                policy.observe(drafted.root_log_probs, accepted_nodes.shape[0])
                sink.emit(torch.cat([tree.tokens[accepted_nodes], bonus[None]]))
