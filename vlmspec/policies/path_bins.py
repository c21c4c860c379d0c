"""HeteroSpec's path-entropy bins for one target and draft: where their edges lie, what they were fitted on, and which
pair they belong to, kept as a small JSON file next to the draft (`CALIBRATION_FILE`, written by `vlmspec calibrate`).

The bins are the leaves of a 3-level regression tree over the cumulative top-K path entropy (HeteroSpec eq. 2), so
they are intervals of that entropy: bin 0 the lowest. A pair is named by a fingerprint of each model (its type, sizes
and a checksum of its input embeddings), so bins fitted to one draft are refused for a retrained one.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CalibrationError

#: The file `vlmspec calibrate` writes next to the draft, and `heterospec` loads from there by default.
CALIBRATION_FILE = "heterospec_bins.json"
#: Embedding rows the checksum of a model reads.
_CHECKSUM_ROWS = 256


def fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """What names a model for its bins: type, vocabulary, width and depth of its text model, and a hash of its first
    input-embedding rows in bfloat16 (the same for a model loaded in any of float32, bfloat16 or float16 from one
    checkpoint, and for its `save_pretrained` copy; different for a retrained one)."""
    config = model.config.get_text_config()
    rows = model.get_input_embeddings().weight[:_CHECKSUM_ROWS].detach().to(torch.bfloat16).view(torch.int16)
    return {
        "model_type": model.config.model_type,
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "hidden_size": int(config.hidden_size),
        "layers": int(config.num_hidden_layers),
        "checksum": hashlib.sha1(rows.cpu().numpy().tobytes()).hexdigest()[:16],
    }


@dataclass
class PathEntropyBins:
    """Bins of the cumulative top-K path entropy Phi (eq. 1): `edges` ascending (bin i holds Phi in
    [edges[i - 1], edges[i]), bin 0 everything below `edges[0]`), so len(edges) + 1 bins. `means` and `counts` are
    each bin's mean terminal confidence rank and number of fitted paths (for the record), `top_k` the K of the
    entropy, `pair` the fingerprints of the target and draft it was fitted to (empty: any pair), and `fitted` how
    (items, steps, seconds)."""

    edges: list[float]
    means: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    top_k: int = 10
    pair: dict[str, dict[str, Any]] = field(default_factory=dict)
    fitted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if any(not math.isfinite(e) for e in self.edges) or self.edges != sorted(self.edges):
            raise CalibrationError(f"bin edges must be finite and ascending, got {self.edges}")

    @property
    def bins(self) -> int:
        return len(self.edges) + 1

    def index(self, entropy: float) -> int:
        """The bin of a path entropy."""
        return bisect.bisect_right(self.edges, entropy)

    def check_pair(self, target: torch.nn.Module, draft: torch.nn.Module) -> None:
        """Refuse bins fitted to another pair, naming the model and what differs."""
        for role, model in (("target", target), ("draft", draft)):
            expected = self.pair.get(role)
            if not expected:
                continue
            found = fingerprint(model)
            differ = [
                f"{key} {expected[key]!r} != {found.get(key)!r}" for key in expected if expected[key] != found.get(key)
            ]
            if differ:
                raise CalibrationError(
                    f"these heterospec bins were fitted to another {role} ({'; '.join(differ)}): run "
                    "`vlmspec calibrate` for this pair"
                )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> PathEntropyBins:
        """Bins from a file `save` wrote; a clear error for anything else."""
        try:
            values = json.loads(Path(path).read_text())
            return PathEntropyBins(**values)
        except (OSError, json.JSONDecodeError, TypeError) as error:
            raise CalibrationError(f"cannot read heterospec bins from {path}: {error}") from error


def bins_beside(draft: torch.nn.Module) -> Path | None:
    """The calibration file next to the draft's weights (a local directory or the hub cache's copy), None if absent."""
    from transformers.utils import cached_file

    source = getattr(draft.config, "_name_or_path", "") or getattr(draft, "name_or_path", "")
    if not source:
        return None
    local = Path(source) / CALIBRATION_FILE
    if local.is_file():
        return local
    if Path(source).exists():
        return None
    found = cached_file(
        source,
        CALIBRATION_FILE,
        local_files_only=True,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    return None if found is None else Path(found)
