"""What the released checkpoints' non-weight files say, value by value, with where each value comes from.

Sources, as tags in the comments:
- [hub] seen in the released file itself (a stored copy of the hub page);
- [copy] seen in a public copy of the released file (a duplicate, quantisation or fine-tune of the checkpoint);
- [conv] written by `transformers`' conversion script for the checkpoint (LLaVA-OneVision-hf);
- [known] not seen here: the value as the checkpoint family is known to ship it, unverified;
- [chosen] not known here: chosen as stated.

Sizes (hidden sizes, layer counts, heads) are the released ones here; `replicas.py` shrinks them.
"""

from __future__ import annotations

import hashlib

QWEN2_5_VL_7B = "Qwen/Qwen2.5-VL-7B-Instruct"
QWEN2_5_VL_3B = "Qwen/Qwen2.5-VL-3B-Instruct"
QWEN3_VL_8B = "Qwen/Qwen3-VL-8B-Instruct"
QWEN3_VL_2B = "Qwen/Qwen3-VL-2B-Instruct"
QWEN3_VL_30B_A3B = "Qwen/Qwen3-VL-30B-A3B-Instruct"
LLAVA_OV_7B = "llava-hf/llava-onevision-qwen2-7b-ov-hf"
LLAVA_OV_05B = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"

#: Qwen2's tokenizer: 151643 byte-level BPE entries, then these, in id order from 151643, with their `special` flag.
QWEN2_ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
#: Qwen3's tokenizer adds these after Qwen2's (151665-151668) [copy: Qwen3 tokenizer_config.json].
QWEN3_EXTRA_TOKENS = (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
#: Qwen2-Instruct's added tokens, then the two LLaVA-OneVision-hf adds [conv: `add_tokens(<image>), add_tokens(<video>)`
#: on Qwen2-7B-Instruct's tokenizer, whose added tokens are these three].
LLAVA_ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<image>", True),
    ("<video>", True),
)
REGULAR_TOKENS = 151643  # [hub] the first added token, <|endoftext|>, is id 151643 in every Qwen2/Qwen3 tokenizer

_QWEN_ADDITIONAL_SPECIAL = [t for t, special in QWEN2_ADDED_TOKENS[1:14] if special]

#: chat_template.json of Qwen2.5-VL-*-Instruct [copy: identical in several repositories that vendor it, one citing
#: the ModelScope file]: a default system prompt, and "Picture n: " / "Video n: " labels under `add_vision_id`.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

#: The Qwen3-VL-*-Instruct chat template [copy: the template inside Qwen's own Qwen3-VL-8B-Instruct GGUF, pinned by
#: SHA-256 below]. No default system prompt; tools, tool responses with media, `add_vision_id` labels.
QWEN3_VL_CHAT_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"""
    r"""You are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within """
    r"""<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": """
    r"""<args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
)
QWEN3_VL_CHAT_TEMPLATE_SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"  # [copy], 5292 bytes

#: chat_template.json of llava-onevision-qwen2-*-ov-hf [conv: the template the conversion script hands the processor].
LLAVA_OV_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: Qwen2-Instruct's own (text) template, kept in the LLaVA-OneVision-hf tokenizer_config.json [known].
QWEN2_INSTRUCT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _qwen2_5_vl_config(
    hidden: int, intermediate: int, heads: int, kv_heads: int, layers: int, max_window: int, tied: bool, vocab: int
) -> dict:
    """config.json of Qwen2.5-VL-*-Instruct, key order as released [hub for 7B; 3B: same layout, its sizes: copy]."""
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 128000,
        "max_window_layers": max_window,
        "model_type": "qwen2_5_vl",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vision_config": {
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": hidden,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": vocab,
    }


def _qwen3_vl_text(hidden: int, intermediate: int, heads: int, kv_heads: int, layers: int, tied: bool) -> dict:
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": 151936,
    }


def _qwen3_vl_vision(depth: int, hidden: int, intermediate: int, out_hidden: int, deepstack: list[int]) -> dict:
    return {
        "deepstack_visual_indexes": deepstack,
        "depth": depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": hidden,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "model_type": "qwen3_vl",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": out_hidden,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }


def _qwen3_vl_config(architecture: str, model_type: str, text: dict, vision: dict, tied: bool) -> dict:
    """config.json of Qwen3-VL-*-Instruct: nested text_config / vision_config [copy: layout of the 4B and 8B files]."""
    return {
        "architectures": [architecture],
        "image_token_id": 151655,
        "model_type": model_type,
        "text_config": text,
        "tie_word_embeddings": tied,
        "transformers_version": "4.57.0.dev0",  # [known]
        "video_token_id": 151656,
        "vision_config": vision,
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    }


def _qwen3_vl_moe_text() -> dict:
    """text_config of Qwen3-VL-30B-A3B-Instruct [copy: a full fine-tune's file; the MoE fields: known]."""
    text = _qwen3_vl_text(2048, 6144, 32, 4, 48, False)
    text["model_type"] = "qwen3_vl_moe_text"
    text.update(
        {
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_experts": 128,
            "num_experts_per_tok": 8,
        }
    )
    return dict(sorted(text.items()))


def _qwen2_text(hidden: int, intermediate: int, heads: int, kv_heads: int, layers: int, vocab: int, tied: bool) -> dict:
    """text_config of LLaVA-OneVision-hf: Qwen2-*-Instruct's config [conv: `AutoConfig(Qwen2-*-Instruct).to_dict()`;
    its values: known], with the vocabulary grown by <image>, <video> and padded to a multiple of 64 [conv]."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "max_position_embeddings": 32768,
        "max_window_layers": layers,
        "model_type": "qwen2",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072 if not tied else 32768,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


#: [hub for 7B/72B: the pinpoints of llava-onevision-qwen2-*-ov-hf; the same 36 as LlavaOnevisionImageProcessor's]
LLAVA_OV_GRID_PINPOINTS = [[h, w] for h in range(384, 2305, 384) for w in range(384, 2305, 384)]


def _llava_ov_config(text: dict, tied: bool) -> dict:
    """config.json of llava-onevision-qwen2-*-ov-hf [hub: head of the 7B and 0.5B files; the rest: conv defaults]."""
    return {
        "architectures": ["LlavaOnevisionForConditionalGeneration"],
        "ignore_index": -100,
        "image_grid_pinpoints": LLAVA_OV_GRID_PINPOINTS,
        "image_token_index": 151646,
        "model_type": "llava_onevision",
        "projector_hidden_act": "gelu",
        "text_config": text,
        "tie_word_embeddings": tied,
        "torch_dtype": "float16",  # [conv: the script converts every weight to float16]
        "transformers_version": "4.45.0.dev0",
        "use_image_newline_parameter": True,
        "video_token_index": 151647,
        "vision_aspect_ratio": "anyres_max_9",
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 384,
            "intermediate_size": 4304,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 26,
            "patch_size": 14,
            "vision_use_head": False,
        },
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full",
    }


QWEN2_5_VL_GENERATION = {  # [copy: identical in fine-tunes of 7B; DESIGN.md]
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 0.1,
    "top_p": 0.001,
    "top_k": 1,
    "transformers_version": "4.37.0",  # [known]
}
QWEN3_VL_GENERATION = {  # [copy: Qwen3-VL-4B-Instruct's file, key order as released; assumed the same for 8B/2B/30B]
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "top_k": 20,
    "top_p": 0.8,
    "repetition_penalty": 1.0,
    "temperature": 0.7,
    "transformers_version": "4.56.0",
}
LLAVA_OV_GENERATION = {  # [hub: llava-onevision-qwen2-7b-ov-hf, 72b-ov-hf; no sampling settings: greedy]
    "_from_model_config": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "transformers_version": "4.45.0.dev0",
}

QWEN2_5_VL_PREPROCESSOR = {  # [known] no video_preprocessor_config.json: the repositories predate video processors
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}
QWEN3_VL_PREPROCESSOR = {  # [known; 390 bytes on the hub]
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
QWEN3_VL_VIDEO_PREPROCESSOR = {  # [copy: Qwen3-VL-8B-Instruct, 385 bytes]
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
}
LLAVA_OV_PREPROCESSOR = {  # [conv: LlavaOnevisionImageProcessor loaded from SigLIP's (mean/std 0.5), defaults else]
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_grid_pinpoints": LLAVA_OV_GRID_PINPOINTS,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "LlavaOnevisionImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "LlavaOnevisionProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 384, "width": 384},
}
LLAVA_OV_VIDEO_PREPROCESSOR = {  # [conv: LlavaOnevisionVideoProcessor from SigLIP's; its saved form: chosen]
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "LlavaOnevisionProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 384, "width": 384},
    "video_processor_type": "LlavaOnevisionVideoProcessor",
}
LLAVA_OV_PROCESSOR = {  # [conv: LlavaOnevisionProcessor(num_image_tokens=729, vision_feature_select_strategy="full")]
    "image_token": "<image>",
    "num_image_tokens": 729,
    "processor_class": "LlavaOnevisionProcessor",
    "video_token": "<video>",
    "vision_feature_select_strategy": "full",
}


def _tokenizer_config(
    added: tuple[tuple[str, bool], ...], additional: list[str], template: str, max_length: int
) -> dict:
    """tokenizer_config.json of a Qwen2-family tokenizer [known: the fields every Qwen2/Qwen3 release carries]."""
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(REGULAR_TOKENS + i): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (token, special) in enumerate(added)
        },
        "additional_special_tokens": additional,
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _checkpoint(
    config: dict, generation: dict, tokenizer_config: dict, added: tuple, chat_template: str, processing: dict
) -> dict:
    """One checkpoint's files: name -> JSON content, plus "added_tokens" (the tokenizer's added tokens in id order)."""
    return {
        "config.json": config,
        "generation_config.json": generation,
        "tokenizer_config.json": tokenizer_config,
        "chat_template.json": {"chat_template": chat_template},
        **processing,
        "added_tokens": added,
    }


_QWEN2_5_TOKENIZER = _tokenizer_config(QWEN2_ADDED_TOKENS, _QWEN_ADDITIONAL_SPECIAL, QWEN2_5_VL_CHAT_TEMPLATE, 131072)
_QWEN3_TOKENIZER = _tokenizer_config(
    QWEN2_ADDED_TOKENS + QWEN3_EXTRA_TOKENS, _QWEN_ADDITIONAL_SPECIAL, QWEN3_VL_CHAT_TEMPLATE, 262144
)
_LLAVA_TOKENIZER = _tokenizer_config(
    LLAVA_ADDED_TOKENS, ["<|im_start|>", "<|im_end|>"], QWEN2_INSTRUCT_CHAT_TEMPLATE, 32768
)

_QWEN3_PROCESSING = {
    "preprocessor_config.json": QWEN3_VL_PREPROCESSOR,
    "video_preprocessor_config.json": QWEN3_VL_VIDEO_PREPROCESSOR,
}
_LLAVA_PROCESSING = {
    "preprocessor_config.json": LLAVA_OV_PREPROCESSOR,
    "video_preprocessor_config.json": LLAVA_OV_VIDEO_PREPROCESSOR,
    "processor_config.json": LLAVA_OV_PROCESSOR,
}

#: Per checkpoint: file name -> content (a dict written as JSON), plus "added_tokens" for the tokenizer.
RELEASED = {
    QWEN2_5_VL_7B: _checkpoint(
        _qwen2_5_vl_config(3584, 18944, 28, 4, 28, 28, False, 152064),
        QWEN2_5_VL_GENERATION,
        _QWEN2_5_TOKENIZER,
        QWEN2_ADDED_TOKENS,
        QWEN2_5_VL_CHAT_TEMPLATE,
        {"preprocessor_config.json": QWEN2_5_VL_PREPROCESSOR},
    ),
    QWEN2_5_VL_3B: _checkpoint(
        _qwen2_5_vl_config(2048, 11008, 16, 2, 36, 70, True, 151936),
        QWEN2_5_VL_GENERATION,
        _QWEN2_5_TOKENIZER,
        QWEN2_ADDED_TOKENS,
        QWEN2_5_VL_CHAT_TEMPLATE,
        {"preprocessor_config.json": QWEN2_5_VL_PREPROCESSOR},
    ),
    QWEN3_VL_8B: _checkpoint(
        _qwen3_vl_config(
            "Qwen3VLForConditionalGeneration",
            "qwen3_vl",
            _qwen3_vl_text(4096, 12288, 32, 8, 36, False),
            _qwen3_vl_vision(27, 1152, 4304, 4096, [8, 16, 24]),
            False,
        ),
        QWEN3_VL_GENERATION,
        _QWEN3_TOKENIZER,
        QWEN2_ADDED_TOKENS + QWEN3_EXTRA_TOKENS,
        QWEN3_VL_CHAT_TEMPLATE,
        _QWEN3_PROCESSING,
    ),
    QWEN3_VL_2B: _checkpoint(
        _qwen3_vl_config(
            "Qwen3VLForConditionalGeneration",
            "qwen3_vl",
            _qwen3_vl_text(2048, 6144, 16, 8, 28, True),
            _qwen3_vl_vision(24, 1024, 4096, 2048, [5, 11, 17]),
            True,
        ),
        QWEN3_VL_GENERATION,
        _QWEN3_TOKENIZER,
        QWEN2_ADDED_TOKENS + QWEN3_EXTRA_TOKENS,
        QWEN3_VL_CHAT_TEMPLATE,
        _QWEN3_PROCESSING,
    ),
    QWEN3_VL_30B_A3B: _checkpoint(
        _qwen3_vl_config(
            "Qwen3VLMoeForConditionalGeneration",
            "qwen3_vl_moe",
            _qwen3_vl_moe_text(),
            _qwen3_vl_vision(27, 1152, 4304, 2048, [8, 16, 24]),
            False,
        ),
        QWEN3_VL_GENERATION,
        _QWEN3_TOKENIZER,
        QWEN2_ADDED_TOKENS + QWEN3_EXTRA_TOKENS,
        QWEN3_VL_CHAT_TEMPLATE,
        _QWEN3_PROCESSING,
    ),
    LLAVA_OV_7B: _checkpoint(
        _llava_ov_config(_qwen2_text(3584, 18944, 28, 4, 28, 152128, False), False),
        LLAVA_OV_GENERATION,
        _LLAVA_TOKENIZER,
        LLAVA_ADDED_TOKENS,
        LLAVA_OV_CHAT_TEMPLATE,
        _LLAVA_PROCESSING,
    ),
    LLAVA_OV_05B: _checkpoint(
        _llava_ov_config(_qwen2_text(896, 4864, 14, 2, 24, 152000, True), True),
        LLAVA_OV_GENERATION,
        _LLAVA_TOKENIZER,
        LLAVA_ADDED_TOKENS,
        LLAVA_OV_CHAT_TEMPLATE,
        _LLAVA_PROCESSING,
    ),
}

#: Values this module could not see in a released file, and what stands in for them.
NOT_KNOWN_HERE = (
    "Qwen2.5-VL-3B-Instruct config.json: layout assumed identical to the 7B file (seen); sizes from copies",
    "Qwen2.5-VL tokenizer_config.json: chat_template (chosen: the chat_template.json template), model_max_length "
    "131072 and the other fields as Qwen2 tokenizers carry them",
    "Qwen2.5-VL generation_config.json transformers_version (chosen: 4.37.0)",
    "Qwen2.5-VL preprocessor_config.json: values as known, not seen",
    "Qwen3-VL-8B/2B/30B-A3B generation_config.json: assumed identical to the 4B file (seen in a copy)",
    "Qwen3-VL-2B and 30B-A3B sizes, deepstack indexes and MoE fields: known, not seen",
    "Qwen3-VL chat_template.json: the template of Qwen's 8B GGUF (seen, hash-pinned); whether the hub's JSON keeps "
    "its final newline is not known (chosen: kept)",
    "Qwen3-VL tokenizer_config.json: model_max_length 262144 and fields as Qwen2 tokenizers carry them",
    "Qwen3-VL preprocessor_config.json: values as known, not seen (the video one was seen)",
    "LLaVA-OneVision-hf config.json text_config: Qwen2-*-Instruct's values, known; torch_dtype float16 from the "
    "conversion script",
    "LLaVA-OneVision-hf tokenizer_config.json: Qwen2-Instruct's fields and template, known, not seen",
    "LLaVA-OneVision-hf video_preprocessor_config.json: its saved form (chosen: the video processor's settings)",
    "every tokenizer's 151643 regular BPE entries (chosen: a small trained vocabulary, then unreachable fillers)",
)


def sha256(text: str) -> str:
    """The hex SHA-256 of `text` encoded as UTF-8 (to pin templates against their source)."""
    return hashlib.sha256(text.encode()).hexdigest()
