"""A draft head's files in the EAGLE-3 layout: read from a folder or hub id (safetensors or `pytorch_model.bin`; the
layer named `midlayer.` as SpecForge writes it or `layers.0.` as some writers do), checked name by name and shape by
shape, and written as SpecForge writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers.utils import cached_file

from ..errors import HeadLayoutError
from .config import HeadConfig, is_head_architecture
from .module import Eagle3Head

#: Weight files a head may be stored in, in the order they are looked for.
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: Entries some writers add that the head does not read: the target's embeddings (the head uses the target's own).
IGNORED = ("embed_tokens.weight",)


def _resolve(path: str | Path, name: str, **hub_kwargs: Any) -> str | None:
    """`name` in the folder or hub repository `path` (None when it holds no such file)."""
    return cached_file(str(path), name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)


def head_config_of(path: str | Path, **hub_kwargs: Any) -> HeadConfig | None:
    """The head config in `path` (a folder or hub id), or None when `path` holds a model that is not a head."""
    found = _resolve(path, "config.json", **hub_kwargs)
    if found is None:
        return None
    raw = json.loads(Path(found).read_text())
    if not is_head_architecture(raw.get("architectures")):
        return None
    return HeadConfig.from_dict(raw, f"{path}/config.json")


def is_head(path: str | Path, **hub_kwargs: Any) -> bool:
    """Whether `path` (a folder or hub id) holds a draft head in the EAGLE-3 layout."""
    try:
        return head_config_of(path, **hub_kwargs) is not None
    except (OSError, ValueError):
        return False


def _state_dict(path: str | Path, **hub_kwargs: Any) -> dict[str, torch.Tensor]:
    """The head's weights under the layout's names (`layers.0.` read as `midlayer.`; a `model.` prefix dropped)."""
    for name in WEIGHT_FILES:
        found = _resolve(path, name, **hub_kwargs)
        if found is not None:
            raw = load_file(found) if name.endswith(".safetensors") else torch.load(found, map_location="cpu")
            break
    else:
        raise HeadLayoutError(f"{path} holds no head weights: looked for {', '.join(WEIGHT_FILES)}")
    state = {}
    for key, tensor in raw.items():
        key = key.removeprefix("model.")
        if key.startswith("layers.0."):
            key = "midlayer." + key.removeprefix("layers.0.")
        if key not in IGNORED:
            state[key] = tensor
    return state


def _check_state(head: Eagle3Head, state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """`state` checked against the layout: every weight present with its shape, nothing unknown; a head without
    `d2t`/`t2d` over its target's whole vocabulary gets the identity map."""
    expected = head.state_dict()
    if "d2t" not in state and "t2d" not in state and head.head_config.draft_vocab_size == head.head_config.vocab_size:
        state = {**state, "d2t": expected["d2t"], "t2d": torch.ones_like(expected["t2d"])}
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise HeadLayoutError(f"{where}: missing weights {missing}, unknown weights {unknown}")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise HeadLayoutError(
                f"{where}: {key} is {tuple(state[key].shape)}, the config makes it {tuple(tensor.shape)}"
            )
    return state


def load_head(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    **hub_kwargs: Any,
) -> Eagle3Head:
    """The head stored in `path` (a folder or hub id), in `dtype` (its config's own when None, float32 if it states
    none) on `device`, in eval mode and not yet bound to its target's embeddings."""
    config = head_config_of(path, **hub_kwargs)
    if config is None:
        raise HeadLayoutError(f"{path} holds no EAGLE-3 head: its config.json does not name an Eagle3 architecture")
    head = Eagle3Head(config)
    head.config._name_or_path = str(path)
    state = _check_state(head, _state_dict(path, **hub_kwargs), str(path))
    head.load_state_dict({k: v.to(torch.bool) if k == "t2d" else v for k, v in state.items()})
    stated = getattr(torch, config.torch_dtype) if isinstance(config.torch_dtype, str) else None
    return head.to(dtype=dtype or stated or torch.float32, device=device).eval()


def save_head(head: Eagle3Head, folder: str | Path) -> Path:
    """Write `head` as SpecForge writes a head: `config.json` and `model.safetensors` (no embeddings)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = head.head_config.to_dict()
    config["torch_dtype"] = str(head.fc.weight.dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
