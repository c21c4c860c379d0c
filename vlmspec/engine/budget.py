"""How many sequences fit in flight: the KV cache of the rows decoded together, against a budget in gigabytes."""

from __future__ import annotations

from transformers import PreTrainedModel

from ..errors import MemoryBudgetError
from .kv_cache import TREE_ROOM


def kv_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes one cached position takes in `model` (keys and values of every layer, in the model's dtype)."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = model.get_input_embeddings().weight.dtype
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize


class KVBudget:
    """The rows in flight share one cache slab per model, every row as long as the longest: B rows of up to
    `positions` each take `B x positions x (target's + draft's bytes per position)`."""

    def __init__(self, gigabytes: float, target: PreTrainedModel, draft: PreTrainedModel):
        if not gigabytes > 0:
            raise ValueError(f"kv_budget_gb must be positive, got {gigabytes}")
        self.bytes = gigabytes * 1e9
        self.gigabytes = gigabytes
        self.per_position = kv_bytes_per_token(target) + kv_bytes_per_token(draft)

    def need(self, positions: int) -> float:
        """Bytes one row of `positions` (prompt and new tokens) takes, with room for a step's tree."""
        return (positions + TREE_ROOM) * self.per_position

    def check(self, positions: int) -> None:
        """Refuse a sequence that could not run even alone."""
        need = self.need(positions)
        if need > self.bytes:
            raise MemoryBudgetError(
                f"a sequence of {positions} positions needs {need / 1e9:.3g} GB of KV cache, more than "
                f"kv_budget_gb={self.gigabytes:g} (--kv-budget-gb); raise the budget or shorten the input"
            )

    def admits(self, in_flight: list[int], positions: int) -> bool:
        """Whether one more row of `positions` fits beside rows of `in_flight` positions."""
        longest = max([positions, *in_flight])
        return (len(in_flight) + 1) * self.need(longest) <= self.bytes
