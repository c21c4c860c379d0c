"""What a draft trains on: a folder of media (each one an item, with the captioning prompt for its kind) or a JSONL
file whose rows are `{"media": path or list of paths, "prompt": text[, "response": text]}`. Rows are checked before
any training, each error naming its line; a medium that cannot be read is recorded and skipped, as `caption` does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, NoInputsError
from ..processors import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, load_images, load_videos, media_kind

#: The prompt of an item given as a bare medium, by its kind (the captioning prompts).
DEFAULT_PROMPTS = {"image": "Describe the image in detail.", "video": "Describe the video in detail."}


@dataclass(frozen=True)
class TrainItem:
    """One prompt: its media paths, its text and, where given, the response to train on (else the target writes it).
    `key` names it in the responses cache and the records."""

    key: str
    media: tuple[str, ...]
    prompt: str
    response: str | None = None


def read_items(source: str | Path) -> list[TrainItem]:
    """The items of a folder of media (sorted by path) or of a JSONL file."""
    path = Path(source)
    if path.is_dir():
        media = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS | VIDEO_EXTENSIONS)
        items = [TrainItem(str(p.relative_to(path)), (str(p),), DEFAULT_PROMPTS[media_kind(p)]) for p in media]
    elif path.is_file():
        items = [_row(line, number, path.parent) for number, line in enumerate(path.read_text().splitlines(), 1)]
        items = [item for item in items if item is not None]
    else:
        raise NoInputsError(f"--data {source}: no such folder or JSONL file")
    if not items:
        raise NoInputsError(f"--data {source}: no image, video or row to train on")
    return items


def _row(line: str, number: int, base: Path) -> TrainItem | None:
    """One JSONL row (None for a blank line), media paths relative to the file's folder."""
    if not line.strip():
        return None
    try:
        row: Any = json.loads(line)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(f"line {number}: not JSON ({error})") from error
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise InvalidArgumentError(f'line {number}: a row is {{"media": ..., "prompt": text[, "response": text]}}')
    media = row.get("media", [])
    media = [media] if isinstance(media, str) else media
    if not isinstance(media, list) or not all(isinstance(m, str) for m in media):
        raise InvalidArgumentError(f"line {number}: media must be a path or a list of paths")
    response = row.get("response")
    if response is not None and not isinstance(response, str):
        raise InvalidArgumentError(f"line {number}: response must be text")
    paths = tuple(str(base / m) if not Path(m).is_absolute() else m for m in media)
    return TrainItem(f"line {number}", paths, row["prompt"], response)


def item_inputs(processor: Any, item: TrainItem) -> dict[str, Any]:
    """The item's prompt inputs (the processor's outputs for its prompt and media, videos sampled by the family's
    rule); raises the media errors `generate` raises, naming the file."""
    images = [m for m in item.media if media_kind(m) == "image"]
    videos = [m for m in item.media if media_kind(m) == "video"]
    loaded_videos = load_videos(videos, sampling=processor.frame_sampling) if videos else []
    return dict(processor.prompt_inputs(item.prompt, load_images(images), loaded_videos, names=images + videos))
