"""The two kinds of draft `vlmspec train-draft` fits, behind one face: each holds its trainable module, gives one
example's loss, and saves itself where `from_pretrained` loads it. A VLM draft learns by distillation (and VSD's path
term); a head by the training-time test's unrolled distillation, reading the target's features from its own forward
over the example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..adapters import ModelAdapter, adapter_for
from ..engine.features import FeatureTap
from ..errors import InvalidArgumentError
from ..heads import Eagle3Head, is_head, load_head, save_head
from ..heads.fit import check_head
from ..heads.new import new_head
from ..loading import load_model
from ..processors import append_tokens
from .examples import Example, draft_log_probs
from .head_examples import head_inputs, unrolled_losses
from .head_objectives import ttt_loss
from .head_paths import HeadPaths
from .objectives import kd_loss
from .responses import Prepared
from .vsd import DraftPaths, ModelPaths, vsd_step_loss

#: The released heads' draft vocabulary: a new head's default, where the target's vocabulary is larger.
DRAFT_VOCAB = 32000


def draft_kind(draft: str | None, kind: str | None) -> str:
    """`kind` ("model" or "head"), or where None the kind of the `draft` folder (a head without one)."""
    if kind is not None:
        return kind
    return "head" if draft is None or is_head(draft) else "model"


def frequent_ids(responses: list[torch.Tensor], limit: int, size: int, reduce=None) -> torch.Tensor:
    """The `size` ids below `limit` most frequent in `responses` (ties to the lower id), sorted: a new head's draft
    vocabulary, as EAGLE-3 builds one from its training data's token counts. `reduce` sums the counts over the
    training processes, so that each builds the same vocabulary."""
    counts = torch.zeros(limit, dtype=torch.float64)
    for response in responses:
        counts += torch.bincount(response[response < limit], minlength=limit).double()
    if reduce is not None:
        counts = reduce(counts)
    order = torch.argsort(-counts, stable=True)
    return order[: min(size, limit)].sort().values


def with_vsd(
    run: Any, paths: DraftPaths, example: Example, loss: torch.Tensor, parts: dict[str, float]
) -> torch.Tensor:
    """`loss` plus VSD's path term (weighted `--vsd-weight`) where the response is long enough for a path, recorded
    in `parts`."""
    settings = run.settings
    term = vsd_step_loss(run.target, run.target_adapter, paths, example, settings.vsd, run.vocab_limit, run.generator)
    if term is None:
        return loss
    parts["vsd"] = float(term.detach())
    return loss + settings.vsd.weight * term


class ModelDrafter:
    """A whole VLM draft: token-level distillation at every response position, and VSD's term at its anchors."""

    def __init__(self, settings: Any, target: PreTrainedModel, device: torch.device):
        self.module = load_model(settings.draft, torch_dtype=torch.float32).to(device)
        self.adapter: ModelAdapter = adapter_for(self.module)
        self.settings = settings

    def loss(self, run: Any, example: Example) -> tuple[torch.Tensor, dict[str, float]]:
        distill = kd_loss(draft_log_probs(self.module, self.adapter, example, run.vocab_limit), example.target_probs)
        parts, loss = {"kd": float(distill.detach())}, distill
        if self.settings.objective == "vsd":
            loss = with_vsd(run, ModelPaths(self.module, self.adapter), example, loss, parts)
        return loss, parts

    def save(self, folder: Path, processor: Any) -> None:
        self.module.save_pretrained(folder)
        processor.save_pretrained(folder)


class HeadDrafter:
    """A draft head: the training-time test over `ttt_steps` unrolled steps, against the target's distribution on
    the head's draft vocabulary (and VSD's term, drafting its paths as tree levels: `head_paths`). A new head (no
    `draft`) starts as EAGLE-3 starts one (`heads.new`), over the `draft_vocab` ids most frequent in the training
    responses."""

    def __init__(self, settings: Any, target: PreTrainedModel, prepared: list[Prepared], reduce, vocab_limit: int):
        if settings.draft is not None:
            head = load_head(settings.draft, dtype=torch.float32).bind(target.get_input_embeddings())
            head.to(target.get_input_embeddings().weight.device)
        else:
            size = settings.draft_vocab or min(DRAFT_VOCAB, vocab_limit)
            ids = frequent_ids([p.response for p in prepared], vocab_limit, size, reduce)
            head = new_head(target, ids, settings.intermediate_size, settings.seed)
        self.module: Eagle3Head = head
        self.draft_ids = head.draft_to_target()
        if int(self.draft_ids.max()) >= vocab_limit:
            raise InvalidArgumentError(
                f"the head drafts ids up to {int(self.draft_ids.max())}, but the target has {vocab_limit} tokens"
            )
        self.tap = FeatureTap.on(adapter_for(target).language_model, check_head(head, target))
        self.steps = settings.ttt_steps
        self.settings = settings

    def loss(self, run: Any, example: Example) -> tuple[torch.Tensor, dict[str, float]]:
        """The example's loss; the tap holds the features of the target's forward that made `example`."""
        features = self.tap.take()
        full = append_tokens(example.inputs, example.response.to(example.inputs["input_ids"].device))
        seen = head_inputs(example, features, run.target_adapter.prompt_positions(full))
        losses = unrolled_losses(self.module, example, seen, self.steps, self.draft_ids)
        loss = ttt_loss(losses)
        parts = {
            "ttt": float(loss.detach()),
            "step 0": float(losses[0].detach()),
            "last step": float(losses[-1].detach()),
        }
        if self.settings.objective == "vsd":
            paths = HeadPaths(self.module, self.tap, run.target_adapter)
            loss = with_vsd(run, paths, example, loss, parts)
        return loss, parts

    def save(self, folder: Path, processor: Any) -> None:
        """The head in the released layout and dtype (bfloat16, as SpecForge and AngelSlim ship heads)."""
        save_head(self.module.to(torch.bfloat16), folder)
        self.module.float()
