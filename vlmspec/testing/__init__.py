"""Offline fixtures: tiny random models of every supported family, local tokenizers and real processor classes."""

from .common import chat_inputs, noisy_copy, sample_frames, sample_image
from .llava_onevision import tiny_llava_onevision, tiny_llava_onevision_processor
from .qwen2_5_vl import tiny_processor, tiny_qwen2_5_vl
from .qwen3_vl import tiny_qwen3_vl, tiny_qwen3_vl_moe, tiny_qwen3_vl_processor
from .replicas import REPLICA_PAIRS, ReplicaPair, replica_config, write_replica, write_replicas
from .tokenizer import build_tokenizer

#: Per family: the factory of its tiny processor and of its tiny target (`factory(seed, hidden_size=...)`).
TINY_FAMILIES = {
    "qwen2_5_vl": (tiny_processor, tiny_qwen2_5_vl),
    "qwen3_vl": (tiny_qwen3_vl_processor, tiny_qwen3_vl),
    "qwen3_vl_moe": (tiny_qwen3_vl_processor, tiny_qwen3_vl_moe),
    "llava_onevision": (tiny_llava_onevision_processor, tiny_llava_onevision),
}

__all__ = [
    "REPLICA_PAIRS",
    "ReplicaPair",
    "TINY_FAMILIES",
    "build_tokenizer",
    "chat_inputs",
    "noisy_copy",
    "replica_config",
    "sample_frames",
    "sample_image",
    "tiny_llava_onevision",
    "tiny_llava_onevision_processor",
    "tiny_processor",
    "tiny_qwen2_5_vl",
    "tiny_qwen3_vl",
    "tiny_qwen3_vl_moe",
    "tiny_qwen3_vl_processor",
    "write_replica",
    "write_replicas",
]
