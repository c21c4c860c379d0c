"""Replicas of the released checkpoints: tiny random weights beside the released non-weight files.

Each replica directory holds what the hub repository holds (config.json, generation_config.json, the tokenizer with
the released special-token ids and vocabulary length, tokenizer_config.json, chat_template.json, the processor
configs) and a `model.safetensors` of random weights in the released dtype and key layout. Only the size fields of
config.json differ from the released file (`TINY`); the vocabulary-sized tensors keep the released row counts, so
head padding is as released. `released_files.py` says where every other value comes from and lists what could not
be known (`NOT_KNOWN_HERE`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import AddedToken
from transformers import Qwen2Tokenizer

from .released_files import (
    LLAVA_OV_05B,
    LLAVA_OV_7B,
    QWEN2_5_VL_3B,
    QWEN2_5_VL_7B,
    QWEN3_VL_2B,
    QWEN3_VL_8B,
    QWEN3_VL_30B_A3B,
    REGULAR_TOKENS,
    RELEASED,
)
from .tokenizer import train_tokenizer

# Qwen2.5-VL has no head_dim field: head_dim = hidden_size / heads, and the released mrope_section [16, 24, 24]
# needs head_dim 128, so its hidden size is 128 with one head. Qwen3-VL keeps the released head_dim 128 explicitly.
_QWEN2_5_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "fullatt_block_indexes": [1]}
_QWEN3_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
_QWEN3_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
_LLAVA_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
_LLAVA_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}

#: Per checkpoint, the config.json values that differ from the released file: sizes only (chosen here).
TINY: dict[str, dict[str, Any]] = {
    QWEN2_5_VL_7B: {
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "vision_config": {**_QWEN2_5_VISION, "out_hidden_size": 128},
    },
    QWEN2_5_VL_3B: {
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vision_config": {**_QWEN2_5_VISION, "out_hidden_size": 128},
    },
    QWEN3_VL_8B: {
        "text_config": {**_QWEN3_TEXT, "num_hidden_layers": 2},
        "vision_config": {**_QWEN3_VISION, "deepstack_visual_indexes": [0, 1]},
    },
    QWEN3_VL_2B: {
        "text_config": {**_QWEN3_TEXT, "num_hidden_layers": 1},
        "vision_config": {**_QWEN3_VISION, "depth": 1, "deepstack_visual_indexes": [0]},
    },
    QWEN3_VL_30B_A3B: {
        "text_config": {
            **_QWEN3_TEXT,
            "num_hidden_layers": 2,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
        "vision_config": {**_QWEN3_VISION, "deepstack_visual_indexes": [0, 1]},
    },
    LLAVA_OV_7B: {
        "text_config": {**_LLAVA_TEXT, "num_hidden_layers": 2, "max_window_layers": 2},
        "vision_config": {**_LLAVA_VISION, "num_hidden_layers": 2},
    },
    LLAVA_OV_05B: {
        "text_config": {**_LLAVA_TEXT, "num_hidden_layers": 1, "max_window_layers": 1},
        "vision_config": {**_LLAVA_VISION, "num_hidden_layers": 1},
    },
}


@dataclass(frozen=True)
class ReplicaPair:
    """A target and its draft, as the README pairs the released checkpoints."""

    target: str
    draft: str


#: The README's pairs, per family name (as in `TINY_FAMILIES`).
REPLICA_PAIRS = {
    "qwen2_5_vl": ReplicaPair(QWEN2_5_VL_7B, QWEN2_5_VL_3B),
    "qwen3_vl": ReplicaPair(QWEN3_VL_8B, QWEN3_VL_2B),
    "qwen3_vl_moe": ReplicaPair(QWEN3_VL_30B_A3B, QWEN3_VL_2B),
    "llava_onevision": ReplicaPair(LLAVA_OV_7B, LLAVA_OV_05B),
}

_CORPUS = (
    "Describe the image in detail. Describe the video in detail. What is shown here? What happens?",
    "A red circle moves to the left while a blue square stays in the middle of the frame.",
    "You are a helpful assistant. The picture shows three green triangles on a white background.",
)
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def replica_config(checkpoint: str) -> dict[str, Any]:
    """The released config.json of `checkpoint` with the tiny sizes of `TINY` put in."""
    return _merged(RELEASED[checkpoint]["config.json"], TINY[checkpoint])


def write_replica(checkpoint: str, directory: str | Path, seed: int = 0) -> Path:
    """Write a replica of `checkpoint` (a hub id from `released_files`) into `directory`; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = RELEASED[checkpoint]
    config = replica_config(checkpoint)
    _write_json(directory / "config.json", config)
    model_config = transformers.AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, config["architectures"][0])
    torch.manual_seed(seed)
    model = model_class(model_config).to(_DTYPES[_dtype_name(config)])
    model.save_pretrained(directory)
    tokenizer = _tokenizer(files["added_tokens"])
    tokenizer.save_pretrained(directory)
    tokenizer.backend_tokenizer.model.save(str(directory))  # vocab.json and merges.txt, as released
    written = {"config.json": config} | {k: v for k, v in files.items() if k.endswith(".json") and k != "config.json"}
    for name, content in written.items():  # after save_pretrained, which writes its own config and tokenizer files
        _write_json(directory / name, content)
    for stray in ("special_tokens_map.json", "chat_template.jinja", "added_tokens.json"):
        (directory / stray).unlink(missing_ok=True)
    return directory


def write_replicas(root: str | Path, families: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Write every pair's replicas under `root` (each checkpoint once); returns family -> (target_dir, draft_dir)."""
    root = Path(root)
    written: dict[str, Path] = {}
    pairs = {}
    for family in families or list(REPLICA_PAIRS):
        pair = REPLICA_PAIRS[family]
        for checkpoint in (pair.target, pair.draft):
            if checkpoint not in written:
                seed = list(RELEASED).index(checkpoint)
                written[checkpoint] = write_replica(checkpoint, root / checkpoint.replace("/", "--"), seed)
        pairs[family] = (str(written[pair.target]), str(written[pair.draft]))
    return pairs


@lru_cache(maxsize=4)
def _tokenizer(added_tokens: tuple[tuple[str, bool], ...]) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer with the released ids: a small trained BPE vocabulary, unreachable fillers up to 151643
    regular entries (no merge produces them), then the added tokens in id order."""
    trained = json.loads(train_tokenizer(list(_CORPUS) * 4, 512, special_tokens=()).backend_tokenizer.to_str())
    vocab = dict(trained["model"]["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["model"]["merges"]]
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), REGULAR_TOKENS)})
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token=None, pad_token=None)
    for token, special in added_tokens:
        tokenizer.add_tokens([AddedToken(token, special=special, normalized=False)], special_tokens=special)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


def _dtype_name(config: dict[str, Any]) -> str:
    return config.get("torch_dtype") or config["text_config"]["dtype"]


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, dict) else value
    return merged


def _write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
