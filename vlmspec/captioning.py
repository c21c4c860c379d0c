"""Batch captioning of image and video collections into a JSON-lines file that survives bad files and interruptions.

Every input gets exactly one line: `{"path", "caption", "new_tokens", "tau", "seconds"}` (under relaxed verification
also `"verification"`, its rule, and `"differing_tokens"`, the caption's tokens that are not the target's choice) or,
for an input that cannot be
captioned (`INPUT_ERRORS`: missing, unreadable or refused media, a prompt that does not fit it, a KV cache over the
memory budget), `{"path", "error", "error_type"}`. Inputs decode together, up to `batch_size` at once
(`SpeculativeVLM.stream`, continuous batching), their media read and processed ahead on background threads; each record
is written as its input finishes, so records follow the order inputs finish in (input order at batch size 1). Settings
that would fail every input alike are refused before any model loads (`check_settings`, `check_prompt_fits`). Any other
error comes from the configuration or the model and would fail every input alike too: it stops the job
(`CaptioningStopped`) and leaves that input, and the others then in flight, unrecorded, so a resume retries them. Lines
are written whole and flushed one by one, so an interrupted run leaves a valid file (a torn last line from a hard kill
is dropped on resume). `resume` skips inputs already recorded; `retry_errors` first removes the error records (an atomic
rewrite of each file) so that those inputs are captioned again. Under `accelerate launch` the inputs are split over the
processes, each writing its own shard, and the first process merges the shards into the output (no duplicates, input
order) with an atomic replace. One run writes an output at a time: the first process holds an exclusive lock beside it
(`<output>.lock`, `OutputLock`) for the whole run. The first process alone takes the lock, reads and prepares the files
and merges; each outcome, or the error it met (another run holding the lock: `OutputInUseError`), reaches every process,
so a sharded run goes on or stops as one.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .engine.rows import RowResult
from .errors import (
    ContextTooLongError,
    EmptyPromptError,
    InvalidArgumentError,
    MediaNotFoundError,
    MediaRejectedError,
    MemoryBudgetError,
    NoFramesError,
    NoInputsError,
    NotAnImageError,
    OutputInUseError,
    PlaceholderMismatchError,
    PromptTypeError,
    UnreadableVideoError,
    UnsupportedMediaError,
    VLMSpecError,
)
from .output_lock import OutputLock
from .processors import (
    IMAGE_EXTENSIONS,
    IMAGE_MARKER,
    VIDEO_EXTENSIONS,
    VIDEO_MARKER,
    chat_messages,
    load_image,
    load_video,
    media_kind,
)
from .processors.checks import check_context, check_count, check_frame_request, check_prompts, check_rate
from .speculative import SpeculativeVLM

DEFAULT_PROMPTS = {"image": "Describe the image in detail.", "video": "Describe the video in detail."}
_MEDIA = IMAGE_EXTENSIONS | VIDEO_EXTENSIONS
#: How many inputs decode together by default (`CaptionSettings.batch_size`, `vlmspec caption --batch-size`): on the
#: project's machine 16 inputs at once with chain drafts captioned 1.31x as many inputs per minute as plain
#: `generate` at 16 and 4.4x as many as sage one at a time (docs/benchmarks.md); 32 was faster still, at twice the KV
#: cache.
DEFAULT_CAPTION_BATCH_SIZE = 16


#: Threads that read and process media ahead of the model.
LOADER_THREADS = max(1, min(4, os.cpu_count() or 1))

#: Errors that belong to one input: recorded for that input, and the job goes on.
INPUT_ERRORS = (
    MediaNotFoundError,
    MediaRejectedError,
    UnsupportedMediaError,
    NotAnImageError,
    UnreadableVideoError,
    NoFramesError,
    EmptyPromptError,
    PlaceholderMismatchError,
    ContextTooLongError,
    MemoryBudgetError,
)
#: Errors of the configuration (generation settings, the pair, missing packages): they stop the job.
CONFIGURATION_ERRORS = (VLMSpecError, NotImplementedError, ImportError)


def discover_inputs(sources: Iterable[str | os.PathLike]) -> list[str]:
    """Files as given, folders searched recursively for images and videos, `.txt` files read as lists of paths."""
    found: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += sorted(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _MEDIA)
        elif path.suffix.lower() == ".txt" and path.is_file():
            lines = (line.strip() for line in path.read_text().splitlines())
            found += [line for line in lines if line and not line.startswith("#")]
        else:
            found.append(str(path))
    return list(dict.fromkeys(found))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete records of a JSON-lines file (a torn last line, without its newline, is ignored)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    records = []
    for line in data[: data.rfind(b"\n") + 1].decode("utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def cut_torn_line(path: Path) -> None:
    """Drop a last line that a hard kill left without its newline, so appended records start on a line of their own."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)


def drop_error_records(path: Path) -> int:
    """Remove the error records from `path`, every other line kept byte for byte (atomic rewrite); returns how many."""
    if not path.exists():
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if not _is_error_record(line)]
    if len(kept) < len(lines):
        _write_atomically(path, kept)
    return len(lines) - len(kept)


def _is_error_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and "error" in record


def _write_atomically(path: Path, lines: Iterable[bytes]) -> None:
    """Replace `path` with `lines` in one step: a reader sees the old file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RecordWriter:
    """Appends one JSON object per line; each line is written whole, flushed and synced before the next."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


@dataclass
class Summary:
    captioned: int = 0
    errors: int = 0
    skipped: int = 0
    retried: int = 0
    new_tokens: int = 0
    #: Wall time of the captioning (inputs decode together, so this is not the sum of the records' seconds).
    seconds: float = 0.0
    taus: list[float] = field(default_factory=list)
    interrupted: bool = False
    stopped: bool = False
    #: The job's inputs whose record in the output is an error, earlier runs' records included (once it is done).
    errors_recorded: int = 0

    @property
    def any_errors(self) -> bool:
        """Whether some input of the job has an error record rather than a caption (written now or before)."""
        return bool(self.errors or self.errors_recorded)

    def line(self) -> str:
        rate = self.new_tokens / self.seconds if self.seconds else 0.0
        per_minute = 60 * (self.captioned + self.errors) / self.seconds if self.seconds else 0.0
        tau = sum(self.taus) / len(self.taus) if self.taus else 0.0
        if self.interrupted:
            state = "interrupted (rerun with --resume to finish)"
        elif self.stopped:
            state = "stopped (rerun with --resume once the error is fixed)"
        else:
            state = "done"
        retried = f" ({self.retried} recorded errors retried)" if self.retried else ""
        count = self.errors_recorded
        kept = ""
        if count:
            kept = f"; the output holds {count} error record{'s' * (count != 1)} (--resume --retry-errors retries them)"
        return (
            f"{state}: {self.captioned} captioned, {self.errors} errors, {self.skipped} already recorded{retried}; "
            f"{self.new_tokens} tokens in {self.seconds:.1f} s ({rate:.1f} tokens/s, {per_minute:.1f} inputs/min), "
            f"mean tau {tau:.2f}{kept}"
        )


@dataclass
class CaptionSettings:
    """What every input gets: the prompt, frame sampling (`start`/`end` seconds bound every video), and the keyword
    arguments of `generate`; and how many inputs decode together.

    `generation` holds only the settings given (e.g. `do_sample`, `repetition_penalty`); the rest stay the model's
    own generation config. With a `seed`, sampling for every input starts from a generator seeded with it and the
    input's path, so a rerun or a resume writes the same captions while inputs draw independently of each other (and
    another `batch_size` does too, but for 1 against above 1 under the default policy, whose trees differ there: a
    sampled draw depends on the tree it is drawn through); without one it draws from the global RNG.

    Up to `batch_size` inputs decode together (each caption is the one the input gets alone). `kv_budget_gb` bounds
    the KV cache (target's and draft's) of the inputs in flight: inputs wait for room, and one that alone exceeds it
    is recorded as a `MemoryBudgetError`; None: no bound.
    """

    prompt: str | None = None
    num_frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    start: float | None = None
    end: float | None = None
    max_new_tokens: int = 256
    generation: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    batch_size: int = DEFAULT_CAPTION_BATCH_SIZE
    kv_budget_gb: float | None = None


def check_settings(settings: CaptionSettings) -> None:
    """Refuse settings that would fail every input alike, before any model loads: frame and token counts, the batch
    size and memory budget, a prompt that is no string, is empty, or whose `<image>`/`<video>` markers fit neither
    one image nor one video."""
    check_count("max_new_tokens", settings.max_new_tokens, optional=False)
    check_count("batch_size", settings.batch_size, optional=False)
    check_rate("kv_budget_gb", settings.kv_budget_gb)
    check_frame_request(settings.num_frames, settings.fps, settings.max_frames, settings.start, settings.end)
    if settings.prompt is None:
        return
    if not isinstance(settings.prompt, str):
        raise PromptTypeError(f"the caption prompt must be a string, got {type(settings.prompt).__name__}")
    check_prompts(settings.prompt)
    misfits = []
    for images, videos in ((1, 0), (0, 1)):
        try:
            chat_messages(settings.prompt, images, videos)
        except PlaceholderMismatchError as error:
            misfits.append(error)
    if len(misfits) == 2:
        raise PlaceholderMismatchError(
            f"the prompt {settings.prompt!r} fits no input (each is one image or one video): {misfits[0]}"
        )


def check_prompt_fits(spec: SpeculativeVLM, settings: CaptionSettings) -> None:
    """Refuse a prompt that leaves no room for any medium: its text alone and max_new_tokens exceed the context."""
    for prompt in [settings.prompt] if settings.prompt else DEFAULT_PROMPTS.values():
        text = prompt.replace(IMAGE_MARKER, "").replace(VIDEO_MARKER, "")
        chat = spec.processor.apply_chat_template(chat_messages(text))
        length = len(spec.processor.tokenizer(chat)["input_ids"])
        what = "the prompt alone, without its media,"
        check_context(
            spec.context_length, length, settings.max_new_tokens, what, "a shorter prompt or fewer new tokens"
        )


def seeded(seed: int | None, path: str) -> dict[str, Any]:
    """`generate`'s `generator` argument for one input, seeded from `seed` and its path; none without a seed."""
    if seed is None:
        return {}
    return {"generator": torch.Generator().manual_seed(keyed_seed(seed, path))}


def keyed_seed(seed: int, key: str) -> int:
    """A seed of its own for the input named `key` in a run seeded `seed`: inputs draw independently of each other,
    and alike in every run and resume, whatever else runs."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class CaptioningStopped(Exception):
    """A configuration or model error stopped the job at `path`, left unrecorded so that a resume retries it, as are
    the other inputs then in flight (`unrecorded`, `path` among them)."""

    def __init__(self, path: str, error: Exception, summary: Summary, unrecorded: list[str] | None = None):
        super().__init__(f"stopped at {path}: {type(error).__name__}: {error}")
        self.path = path
        self.error = error
        self.summary = summary
        self.unrecorded = unrecorded if unrecorded is not None else [path]

    @property
    def configuration(self) -> bool:
        """Whether the configuration failed (the settings, the pair, the environment) rather than the model."""
        return isinstance(self.error, CONFIGURATION_ERRORS)


def load_input(path: str, settings: CaptionSettings, frame_sampling: Any) -> tuple[str, Any]:
    """One input's kind (`"image"` or `"video"`) and its media, read as `settings` and `frame_sampling` say."""
    kind = media_kind(path)
    if kind == "image":
        return kind, load_image(path)
    return kind, load_video(
        path,
        num_frames=settings.num_frames,
        fps=settings.fps,
        max_frames=settings.max_frames,
        start=settings.start,
        end=settings.end,
        sampling=frame_sampling,
    )


def _prepare(spec: SpeculativeVLM, path: str, settings: CaptionSettings, processing: threading.Lock) -> dict:
    """One input's model inputs: its medium decoded, then processed with the prompt (one input at a time: processors
    and their tokenizers are not made for concurrent calls), checked against the context."""
    kind, media = load_input(path, settings, spec.processor.frame_sampling)
    prompt = settings.prompt or DEFAULT_PROMPTS[kind]
    images, videos = ([media], []) if kind == "image" else ([], [media])
    with processing:
        inputs = spec.processor.prompt_inputs(prompt, images, videos, [path])
    length = inputs["input_ids"].shape[1]
    check_context(spec.context_length, length, settings.max_new_tokens, f"{path} with the prompt")
    return dict(inputs)


class _Inputs:
    """The job's inputs as `SpeculativeVLM.stream` takes them, `(path, model inputs, the path's own generation
    options)`, read lazily: `batch_size + 2` inputs ahead are decoded and processed on `LOADER_THREADS` threads, so
    the model never waits for frames. An input whose media or prompt fail (`INPUT_ERRORS`) goes to `failed` and
    never reaches the model; any other error of an input is raised, naming it in `stopped_at`."""

    def __init__(
        self,
        spec: SpeculativeVLM,
        paths: list[str],
        settings: CaptionSettings,
        failed: Callable[[str, Exception], None],
    ):
        self.spec = spec
        self.settings = settings
        self.failed = failed
        self.paths = iter(paths)
        self.ahead = settings.batch_size + 2
        self.pending: deque[tuple[str, Future]] = deque()
        #: Inputs handed to the model and not yet finished, in input order, with their prompts' lengths.
        self.in_flight: dict[str, int] = {}
        self.stopped_at: str | None = None
        self._processing = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=LOADER_THREADS, thread_name_prefix="vlmspec-media")

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
        self._fill()
        while self.pending:
            path, future = self.pending.popleft()
            self._fill()
            self.stopped_at = path  # until it is handed on: an error here stops the job at this input
            try:
                inputs = future.result()
            except INPUT_ERRORS as error:
                self.failed(path, error)
                self.stopped_at = None
                continue
            self.stopped_at = None
            self.in_flight[path] = inputs["input_ids"].shape[1]
            yield path, inputs, seeded(self.settings.seed, path)

    def _fill(self) -> None:
        while len(self.pending) < self.ahead:
            path = next(self.paths, None)
            if path is None:
                return
            self.pending.append((path, self._pool.submit(_prepare, self.spec, path, self.settings, self._processing)))

    def finished(self, path: str) -> int:
        """Take a finished input out of those in flight; returns its prompt's length."""
        return self.in_flight.pop(path)

    def unrecorded(self) -> list[str]:
        """The inputs a job stopping now leaves without a record: the one whose own error stops it, and those in
        flight."""
        first = [] if self.stopped_at is None else [self.stopped_at]
        return first + list(self.in_flight)

    def close(self) -> None:
        """Drop the inputs read ahead (a load under way finishes on its thread; none is waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Job:
    """The one writer of a caption job: each record written whole, counted in the summary and the progress bar."""

    def __init__(self, out: Path, total: int, progress: bool):
        self.summary = Summary()
        self.writer = RecordWriter(out)
        self.bar = tqdm(total=total, desc="captioning", unit="file", disable=not progress)
        self.started = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        summary = self.summary
        summary.seconds = time.perf_counter() - self.started
        if "error" in record:
            summary.errors += 1
        else:
            summary.captioned += 1
            summary.new_tokens += record["new_tokens"]
            summary.taus.append(record["tau"])
        rate = summary.new_tokens / max(summary.seconds, 1e-9)
        self.bar.set_postfix(tok_s=f"{rate:.1f}", errors=summary.errors)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def caption_paths(
    spec: SpeculativeVLM, paths: list[str], out: Path, settings: CaptionSettings, progress: bool = True
) -> Summary:
    """Caption `paths` into `out` (appending), up to `settings.batch_size` at once, each record written as its input
    finishes. An input error becomes that input's error record and the run goes on; any other error raises
    `CaptioningStopped` at once, the records written so far staying in `out`."""
    job = _Job(out, len(paths), progress)
    inputs = _Inputs(spec, paths, settings, lambda path, error: job.write(_error_record(path, error)))
    results = spec.stream(
        inputs,
        settings.batch_size,
        kv_budget_gb=settings.kv_budget_gb,
        max_new_tokens=settings.max_new_tokens,
        **settings.generation,
    )
    try:
        for result in results:
            length = inputs.finished(result.key)
            if isinstance(result.error, INPUT_ERRORS):
                job.write(_error_record(result.key, result.error))
            elif result.error is not None:
                raise _Stop(result.key, result.error, [result.key, *inputs.unrecorded()])
            else:
                job.write(_caption_record(spec, result, length))
    except KeyboardInterrupt:
        job.summary.interrupted = True
    except _Stop as stop:
        job.summary.stopped = True
        raise CaptioningStopped(stop.path, stop.error, job.summary, stop.unrecorded) from stop.error
    except Exception as error:
        job.summary.stopped = True
        unrecorded = inputs.unrecorded()
        path = unrecorded[0] if unrecorded else (inputs.pending[0][0] if inputs.pending else "")
        raise CaptioningStopped(path, error, job.summary, unrecorded or [path]) from error
    finally:
        results.close()
        inputs.close()
        job.close()
    return job.summary


class _Stop(Exception):
    """An input's own error that stops the job."""

    def __init__(self, path: str, error: Exception, unrecorded: list[str]):
        self.path, self.error, self.unrecorded = path, error, unrecorded


def _caption_record(spec: SpeculativeVLM, result: RowResult, length: int) -> dict[str, Any]:
    """The record of a captioned input (`length` prompt tokens): its text, tokens, tau and its own seconds, from its
    admission to its end."""
    stats = result.stats
    record = {
        "path": result.key,
        "caption": spec.processor.tokenizer.decode(result.sequence[0, length:], skip_special_tokens=True),
        "new_tokens": stats.new_tokens,
        "tau": round(stats.mean_accept_length, 3),
        "seconds": round(stats.total_seconds, 3),
    }
    if stats.verification != "exact":  # lossy: the caption may not be the target's own
        record |= {"verification": stats.verification, "differing_tokens": stats.differing_tokens}
    return record


def _error_record(path: str, error: Exception) -> dict[str, Any]:
    """The record of an input that cannot be captioned; its message names the input."""
    message = str(error) if path in str(error) else f"{path}: {error}"
    return {"path": path, "error": message, "error_type": type(error).__name__}


def shard_paths(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.part*"))


def recorded(out: Path) -> set[str]:
    """Paths recorded in `out` or in shards left by an interrupted sharded run."""
    return {r["path"] for f in [out, *shard_paths(out)] for r in read_records(f) if "path" in r}


def count_error_records(out: Path, paths: list[str]) -> int:
    """How many of `paths` are recorded in `out` as errors."""
    wanted = set(paths)
    return sum(1 for r in read_records(out) if "error" in r and r.get("path") in wanted)


def merge_shards(out: Path, order: list[str]) -> None:
    """Fold shard records into `out`: one record per path (the first seen), in input order, replaced atomically."""
    shards = shard_paths(out)
    if not shards:
        return
    by_path: dict[str, dict[str, Any]] = {}
    for f in [out, *shards]:
        for record in read_records(f):
            by_path.setdefault(record.get("path"), record)
    rank = {p: i for i, p in enumerate(order)}
    records = sorted(by_path.values(), key=lambda r: rank.get(r.get("path"), len(rank)))
    _write_atomically(out, ((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8") for r in records))
    for shard in shards:
        shard.unlink()


def run_captioning(
    spec_factory: Callable[[Any], SpeculativeVLM],
    sources: list[str],
    out: Path,
    settings: CaptionSettings,
    resume: bool = False,
    progress: bool = True,
    retry_errors: bool = False,
) -> Summary:
    """Discover inputs, skip recorded ones on `resume` (but those recorded as errors with `retry_errors`), caption the
    rest (sharded under accelerate) and merge. A configuration or model error raises `CaptioningStopped`; another
    run holding `out`'s lock raises `OutputInUseError`."""
    from accelerate import PartialState

    if retry_errors and not resume:
        raise InvalidArgumentError("retry_errors continues an existing output: it needs resume=True")
    check_settings(settings)
    state = PartialState(cpu=_cpu_processes())
    lock = OutputLock(out)
    try:
        if not _on_main(state, lock.acquire):
            holder = lock.holder()
            raise OutputInUseError(
                f"{out} is being written by another caption run{f' (pid {holder})' if holder else ''}: wait for "
                f"it to finish, then --resume, or choose another --out"
            )
        return _run_locked(spec_factory, state, sources, out, settings, resume, progress, retry_errors)
    finally:
        lock.release()


def _cpu_processes() -> bool:
    """Whether the processes run on CPUs: asked for (`accelerate launch --cpu` sets `ACCELERATE_USE_CPU`, as
    `Accelerator` reads it), or launched several to a machine without an accelerator (`torchrun`, `accelerate launch
    --multi_gpu`), where accelerate would otherwise take each process for a lone one and all would caption everything.
    """
    from accelerate.utils import parse_flag_from_env

    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; CUDA alone before
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    return parse_flag_from_env("ACCELERATE_USE_CPU") or (launched and not available)


def _on_main(state: Any, compute: Callable[[], Any]) -> Any:
    """`compute()` run by the first process, and its result, or the error it raised, handed to every process: all go
    on with the same value or stop with the same error, none left waiting in a collective the first never reaches."""
    from accelerate.utils import broadcast_object_list

    outcome: list[Any] = [None]
    if state.is_main_process:
        try:
            outcome[0] = (True, compute())
        except Exception as error:
            outcome[0] = (False, error)
    if state.num_processes > 1:
        broadcast_object_list(outcome, from_process=0)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _job_inputs(sources: list[str], out: Path, resume: bool) -> list[str]:
    """The inputs of the job; none, or an existing output without `resume`, is an error."""
    paths = discover_inputs(sources)
    if not paths:
        raise NoInputsError(
            f"no inputs found in {', '.join(map(str, sources))}: folders are searched recursively for "
            f"{', '.join(sorted(_MEDIA))}, and .txt files are read as lists of paths"
        )
    if not resume and (out.exists() or shard_paths(out)):
        raise FileExistsError(f"{out} already exists: pass --resume to continue it, or choose another --out")
    return paths


def _prepare_resume(out: Path, paths: list[str], resume: bool, retry_errors: bool) -> tuple[int, list[str]]:
    """Torn last lines cut and, with `retry_errors`, error records dropped; returns how many were dropped and the
    inputs still to caption."""
    if not resume:
        return 0, paths
    retried = 0
    for f in [out, *shard_paths(out)]:
        cut_torn_line(f)
        if retry_errors:
            retried += drop_error_records(f)
    done = recorded(out)
    return retried, [p for p in paths if p not in done]


def _merged(out: Path, paths: list[str]) -> int:
    """Merge the shards into `out`; returns how many of the job's inputs it records as errors."""
    merge_shards(out, paths)
    return count_error_records(out, paths)


def _run_locked(
    spec_factory: Callable[[Any], SpeculativeVLM],
    state: Any,
    sources: list[str],
    out: Path,
    settings: CaptionSettings,
    resume: bool,
    progress: bool,
    retry_errors: bool,
) -> Summary:
    """`run_captioning` once the output's lock is held. The first process reads and prepares the files and merges the
    shards, handing the outcome to all; no process returns before the merge, so a launcher that stops the others when
    one exits can never cut it short."""
    paths = _on_main(state, lambda: _job_inputs(sources, out, resume))
    retried, todo = _on_main(state, lambda: _prepare_resume(out, paths, resume, retry_errors))
    spec = spec_factory(state)
    check_prompt_fits(spec, settings)
    try:
        if state.num_processes == 1:
            summary = caption_paths(spec, todo, out, settings, progress)
        else:
            with state.split_between_processes(todo) as mine:
                shard = out.with_name(f"{out.name}.part{state.process_index}")
                summary = caption_paths(spec, list(mine), shard, settings, progress and state.is_main_process)
            state.wait_for_everyone()
        summary.errors_recorded = _on_main(state, lambda: _merged(out, paths))
    except CaptioningStopped as stop:
        stop.summary.skipped, stop.summary.retried = len(paths) - len(todo), retried
        raise
    summary.skipped, summary.retried = len(paths) - len(todo), retried
    return summary
