"""Responses the draft trains on: the item's own, or what the target writes for it with its own `generate` under its
own generation config, kept in a JSONL file as each is written, so a killed run loses no finished item. Items whose
media cannot be read are recorded there with their error and skipped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from ..captioning import keyed_seed
from ..errors import VLMSpecError
from .data import TrainItem, item_inputs


@dataclass
class Prepared:
    """An item ready to train on: its prompt inputs (on the CPU) and response ids `(R,)`."""

    item: TrainItem
    inputs: dict[str, Any]
    response: torch.Tensor


def _records(path: Path) -> dict[str, dict[str, Any]]:
    """The records written so far, by item key (a line cut short by a kill is dropped)."""
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[record["key"]] = record
    return records


def prepared_items(
    items: list[TrainItem],
    processor: Any,
    target: PreTrainedModel,
    cache: Path,
    max_new_tokens: int,
    seed: int = 0,
) -> Iterator[Prepared]:
    """Each readable item with its response: its own, the cached one, or one the target writes now (appended to
    `cache` at once; where its config samples, drawn after seeding the RNG from `seed` and the item's key, so a rerun
    writes the same responses). An unreadable medium's error is recorded in `cache` and the item skipped."""
    records = _records(cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = processor.tokenizer
    with cache.open("a") as out:
        for item in tqdm(items, desc="responses", unit="item", leave=False):
            record = records.get(item.key)
            if record is not None and "error" in record:
                continue
            try:
                inputs = item_inputs(processor, item)
            except (VLMSpecError, OSError) as error:
                out.write(json.dumps({"key": item.key, "error": f"{type(error).__name__}: {error}"}) + "\n")
                out.flush()
                continue
            if item.response is not None:
                ids = tokenizer(item.response + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            elif record is not None:
                ids = record["response_ids"]
            else:
                torch.manual_seed(keyed_seed(seed, item.key))
                ids = _write_response(target, inputs, max_new_tokens)
                out.write(json.dumps({"key": item.key, "response_ids": ids}) + "\n")
                out.flush()
            yield Prepared(item, inputs, torch.tensor(ids, dtype=torch.long))


@torch.no_grad()
def _write_response(target: PreTrainedModel, inputs: dict[str, Any], max_new_tokens: int) -> list[int]:
    """The target's own answer to a prompt: its `generate` under its generation config."""
    device = target.get_input_embeddings().weight.device
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    sequence = target.generate(**on_device, max_new_tokens=max_new_tokens)
    return sequence[0, inputs["input_ids"].shape[1] :].tolist()
