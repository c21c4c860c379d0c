"""The prompt passes of both models: the target over its prompt (scoring the visual tokens for the draft's pruning on
the way), then the draft over the tokens pruning leaves it."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from ..adapters import VisualLayout
from ..policies import TreePolicy
from ..pruning import PruningConfig, VerifierScores
from .kv_cache import PromptSlot
from .model_runner import ModelRunner
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
            _, prefill.draft_prompt = draft.prefill(prefill.draft_inputs, room, keep)
        stats.draft_prefill_tokens = prefill.draft_prompt.length
