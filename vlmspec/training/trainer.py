"""`vlmspec train-draft`: fit a draft (a VLM or a head, `drafters`) to its target, by token-level distillation (`kd`;
a head's is the training-time test's) or with VSD's path-level term beside it (`vsd`), on accelerate (one CPU
process, or `accelerate launch` over GPUs and nodes), checkpointed and resumable, judged by the acceptance it gives
when decoding."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm import tqdm

from ..adapters import adapter_for
from ..errors import InvalidArgumentError
from ..loading import check_tokenizers, load_model, model_class_for
from ..processors import load_processor
from ..pruning import resolve_pruning
from ..speculative import check_vocabularies
from .data import read_items
from .drafters import HeadDrafter, ModelDrafter, draft_kind
from .evaluation import evaluate, plot_evaluations
from .examples import make_example
from .responses import Prepared, prepared_items
from .vsd import VSDConfig

#: Settings a resumed run must share with the run it resumes (the rest, such as the budget, may change).
_FIXED = (
    *("target", "draft", "kind", "data", "objective", "lr", "accumulation", "pruning", "max_new_tokens", "seed"),
    *("vsd", "draft_vocab", "ttt_steps", "intermediate_size"),
)


@dataclass
class TrainSettings:
    """What a training run does. `steps` and `time_budget` (minutes) stop it, whichever comes first; `eval_every`
    measures the held-out acceptance every so many steps (on the last `eval_items` items, which are not trained on).
    `kind` is "model" or "head" (default: the kind of `draft`; a new head without one); a new head drafts over the
    `draft_vocab` most frequent response tokens (default: the target's vocabulary up to 32,000) with an MLP of
    `intermediate_size` (default: the target's); a head trains over `ttt_steps` unrolled steps."""

    target: str
    draft: str | None
    data: str
    out: str
    kind: str | None = None
    objective: str = "kd"
    steps: int | None = 200
    time_budget: float | None = None
    lr: float = 1e-4
    accumulation: int = 1
    checkpoint_every: int = 50
    eval_every: int | None = None
    eval_items: int = 4
    pruning: str | None = "auto"
    max_new_tokens: int = 64
    seed: int = 0
    vsd: VSDConfig = field(default_factory=VSDConfig)
    draft_vocab: int | None = None
    ttt_steps: int = 7
    intermediate_size: int | None = None

    def __post_init__(self):
        self.kind = draft_kind(self.draft, self.kind)
        if self.kind not in ("model", "head"):
            raise InvalidArgumentError(f"--kind must be model or head, got {self.kind!r}")
        if self.kind == "model" and self.draft is None:
            raise InvalidArgumentError("--kind model needs --draft: the VLM draft to start from")
        if self.ttt_steps < 1 or (self.draft_vocab is not None and self.draft_vocab < 1):
            raise InvalidArgumentError("--ttt-steps and --draft-vocab must be at least 1")
        if self.objective not in ("kd", "vsd"):
            raise InvalidArgumentError(f"--objective must be kd or vsd, got {self.objective!r}")
        if self.steps is None and self.time_budget is None:
            raise InvalidArgumentError("give --steps or --time-budget (or both): training needs an end")
        if (self.steps is not None and self.steps < 1) or self.lr <= 0 or self.accumulation < 1:
            raise InvalidArgumentError("--steps and --accumulation must be at least 1 and --lr above 0")


class Run:
    """A training run's models, data and state. A head (`drafter`) and the draft's optimiser come with `start`, once
    the responses are known (a new head's vocabulary is theirs)."""

    def __init__(self, settings: TrainSettings, accelerator: Accelerator):
        self.settings, self.accelerator = settings, accelerator
        self.target = load_model(settings.target, torch_dtype=torch.float32).to(accelerator.device)
        self.target.requires_grad_(False)
        self.target_adapter = adapter_for(self.target)
        self.processor = load_processor(settings.target)
        self.pruning = resolve_pruning(settings.pruning, None, settings.kind == "head")
        # A VLM draft is loaded and checked against the target before any response is written; a head waits for
        # the responses (a new one's vocabulary is theirs).
        self.drafter: ModelDrafter | HeadDrafter | None = None
        self.vocab_limit = check_vocabularies(self.target, self.target, len(self.processor.tokenizer))
        if settings.kind == "model":
            self.drafter = ModelDrafter(settings, self.target, accelerator.device)
            self.vocab_limit = check_vocabularies(self.target, self.draft, len(self.processor.tokenizer))
        self.optimizer: torch.optim.Optimizer | None = None
        self.step = 0
        self.order = random.Random(settings.seed)
        self.queue: list[str] = []
        self.generator = torch.Generator().manual_seed(settings.seed + accelerator.process_index)

    def start(self, prepared: list[Prepared]) -> None:
        """Load the head, or make a new one over the responses' most frequent tokens (counted over every process),
        and the draft's optimiser."""
        settings, device = self.settings, self.accelerator.device
        if self.drafter is None:
            reduce = (lambda t: self.accelerator.reduce(t.to(device), "sum").cpu()) if self._shared else None
            self.drafter = HeadDrafter(settings, self.target, prepared, reduce, self.vocab_limit)
            self.vocab_limit = check_vocabularies(self.target, self.draft, len(self.processor.tokenizer))
        # Not wrapped for DDP: VSD runs the draft several times before one backward, so the processes average their
        # gradients themselves (`sync_gradients`).
        self.draft.train()
        self.optimizer = torch.optim.AdamW(self.draft.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)

    @property
    def _shared(self) -> bool:
        return self.accelerator.num_processes > 1

    @property
    def draft(self) -> torch.nn.Module:
        """The module being trained."""
        return self.drafter.module

    def sync_gradients(self) -> None:
        """Average the draft's gradients over the processes (one all-reduce per parameter), then clip them."""
        if self._shared:
            for parameter in self.draft.parameters():
                if parameter.grad is not None:
                    parameter.grad = self.accelerator.reduce(parameter.grad, "mean")
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 0.5)

    def loss(self, prepared: Prepared) -> tuple[torch.Tensor, dict[str, float]]:
        """One item's loss, as its drafter computes it from the target's forward over the item (`make_example`)."""
        device = self.accelerator.device
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in prepared.inputs.items()}
        example = make_example(
            self.target, self.target_adapter, inputs, prepared.response.to(device), self.pruning, self.vocab_limit
        )
        return self.drafter.loss(self, example)


def train_draft(settings: TrainSettings, resume: bool = False) -> Path:
    """Train, checkpoint every `checkpoint_every` steps, and save the draft (loadable with `from_pretrained`) in
    `out/draft`; returns that folder."""
    out = Path(settings.out)
    # Without CUDA, processes a launcher started train together over gloo (accelerate's multi-CPU mode).
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    # What makes a pair untrainable is refused before anything is written or loaded.
    model_class_for(settings.target)
    if settings.kind == "model":
        model_class_for(settings.draft)
        check_tokenizers(settings.target, settings.draft)
    items = read_items(settings.data)
    _check_resume(settings, out, resume, accelerator)
    run = Run(settings, accelerator)
    held_out = items[-settings.eval_items :] if settings.eval_every else []
    training = items[: len(items) - len(held_out)]
    responses = out / f"responses-{accelerator.process_index}.jsonl"
    own = training[accelerator.process_index :: accelerator.num_processes]
    made = (run.processor, run.target, responses, settings.max_new_tokens, settings.seed)
    prepared = list(prepared_items(own, *made))
    if not prepared:
        raise InvalidArgumentError(f"--data {settings.data}: no item could be read (see {responses})")
    run.start(prepared)
    if resume:
        _load_checkpoint(run, out)
    _loop(run, prepared, held_out, out)
    return _save(run, out)


def _check_resume(settings: TrainSettings, out: Path, resume: bool, accelerator: Accelerator) -> None:
    """Refuse a resume from a run with other settings (naming them), and a fresh run over an earlier one's output."""
    path = out / "settings.json"
    mine = json.loads(json.dumps(asdict(settings)))
    if resume:
        if not path.exists():
            raise InvalidArgumentError(f"--resume: {out} holds no run to resume")
        theirs = json.loads(path.read_text())
        differ = [name for name in _FIXED if theirs.get(name) != mine.get(name)]
        if differ:
            raise InvalidArgumentError(f"--resume: {', '.join(differ)} differ from the run in {out}")
    elif path.exists():
        raise InvalidArgumentError(f"{out} holds an earlier run: pass --resume to go on, or another --out")
    accelerator.wait_for_everyone()  # every process has checked before the first writes
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mine, indent=1))


def _loop(run: Run, prepared: list[Prepared], held_out: list, out: Path) -> None:
    """Train until the steps or the time budget run out, logging each step and checkpointing."""
    settings, accelerator = run.settings, run.accelerator
    deadline = None if settings.time_budget is None else time.perf_counter() + 60 * settings.time_budget
    by_key = {p.item.key: p for p in prepared}
    log = (out / "log.jsonl").open("a") if accelerator.is_main_process else None
    bar = tqdm(total=settings.steps, initial=run.step, desc=f"train-draft {settings.objective}", unit="step")
    while (settings.steps is None or run.step < settings.steps) and not _out_of_time(run, deadline):
        record = _step(run, by_key)
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.3f}", s_per_step=f"{record['seconds']:.2f}")
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if run.step % settings.checkpoint_every == 0:
            _checkpoint(run, out)
        if settings.eval_every and run.step % settings.eval_every == 0 and accelerator.is_main_process:
            _evaluate(run, held_out, out)
    bar.close()
    _checkpoint(run, out)
    if settings.eval_every and accelerator.is_main_process and run.step % settings.eval_every:
        _evaluate(run, held_out, out)


def _out_of_time(run: Run, deadline: float | None) -> bool:
    """Whether the time budget is spent, agreed by every process (one that stopped alone would leave the others
    waiting at their next gradient average)."""
    if deadline is None:
        return False
    over = torch.tensor(float(time.perf_counter() >= deadline), device=run.accelerator.device)
    if run.accelerator.num_processes > 1:
        over = run.accelerator.reduce(over, "max")
    return bool(over)


def _step(run: Run, by_key: dict[str, Prepared]) -> dict[str, float]:
    """One optimiser step over `accumulation` items (in a shuffled order, every item once per epoch); its record."""
    started = time.perf_counter()
    total, parts = 0.0, {}
    for _ in range(run.settings.accumulation):
        # A resumed process's queue keeps only its own items (the checkpoint holds the first process's).
        run.queue = [key for key in run.queue if key in by_key]
        if not run.queue:
            run.queue = run.order.sample(sorted(by_key), len(by_key))
        with run.accelerator.autocast():
            loss, parts = run.loss(by_key[run.queue.pop()])
        (loss / run.settings.accumulation).backward()
        total += float(loss.detach()) / run.settings.accumulation
    run.sync_gradients()
    run.optimizer.step()
    run.optimizer.zero_grad()
    run.step += 1
    return {"step": run.step, "loss": total, **parts, "seconds": time.perf_counter() - started}


def _evaluate(run: Run, held_out: list, out: Path) -> None:
    """Held-out acceptance and speedup now, appended to `eval.jsonl` and drawn in `eval.png`."""
    run.draft.eval()
    result = evaluate(run.target, run.draft, run.processor, held_out)
    run.draft.train()
    with (out / "eval.jsonl").open("a") as log:
        log.write(json.dumps({"step": run.step, **result}) + "\n")
    plot_evaluations(out / "eval.jsonl", out / "eval.png")


def _checkpoint(run: Run, out: Path) -> None:
    """The draft, the optimiser, the step and where the shuffled order stands, written whole (a kill mid-write leaves
    the last checkpoint)."""
    if not run.accelerator.is_main_process:
        return
    folder = out / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "draft": run.draft.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "step": run.step,
        "order": run.order.getstate(),
        "queue": run.queue,
        "generator": run.generator.get_state(),
    }
    torch.save(state, folder / "last.pt.partial")
    (folder / "last.pt.partial").replace(folder / "last.pt")


def _load_checkpoint(run: Run, out: Path) -> None:
    path = out / "checkpoints" / "last.pt"
    if not path.exists():
        # Killed before its first checkpoint (while the target wrote responses, say): training starts over, the
        # responses written stay.
        _cut_log(run, out)
        return
    state = torch.load(path, map_location=run.accelerator.device, weights_only=False)
    run.draft.load_state_dict(state["draft"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.step, run.queue = state["step"], state["queue"]
    run.order.setstate(state["order"])
    run.generator.set_state(state["generator"])
    _cut_log(run, out)


def _cut_log(run: Run, out: Path) -> None:
    """Keep the log's records up to the step training goes on from."""
    log = out / "log.jsonl"
    if run.accelerator.is_main_process and log.exists():
        # Steps past the checkpoint run again: their first records go, so the curve goes on from the checkpoint.
        kept = [line for line in log.read_text().splitlines() if _step_of(line) <= run.step]
        log.write_text("".join(line + "\n" for line in kept))


def _step_of(line: str) -> float:
    """The step of a log record (a line a kill cut short counts as past every step)."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError):
        return float("inf")


def _save(run: Run, out: Path) -> Path:
    """The trained draft for `from_pretrained`: a VLM with the target's processor files, a head in the released
    layout."""
    folder = out / "draft"
    run.accelerator.wait_for_everyone()
    if run.accelerator.is_main_process:
        run.drafter.save(folder, run.processor)
    return folder


def settings_from(args: Any) -> TrainSettings:
    """Settings from the command line's arguments."""
    return TrainSettings(
        target=args.target,
        draft=args.draft,
        kind=args.kind,
        data=args.data,
        out=args.out,
        objective=args.objective,
        steps=args.steps,
        time_budget=args.time_budget,
        lr=args.lr,
        accumulation=args.accumulation,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        eval_items=args.eval_items,
        pruning=None if args.pruning == "off" else args.pruning,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        vsd=VSDConfig(
            samples=args.vsd_samples, length=args.vsd_length, anchors=args.vsd_anchors, weight=args.vsd_weight
        ),
        draft_vocab=args.draft_vocab,
        ttt_steps=args.ttt_steps,
        intermediate_size=args.intermediate_size,
    )
