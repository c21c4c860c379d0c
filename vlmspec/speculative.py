"""`SpeculativeVLM`: a target and a draft that together `generate` exactly what the target alone would, faster."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .adapters import adapter_for
from .adapters.base import EMBEDDING_KEYS
from .engine.batch import BatchDecoder
from .engine.budget import KVBudget
from .engine.compiled import LARGEST_FORWARD, CompileGuard, compiled_forward
from .engine.features import FeatureTap
from .engine.head_runner import HeadRunner
from .engine.model_runner import ModelRunner
from .engine.prefill import Prefiller
from .engine.prefix import Continuation
from .engine.relaxed import RelaxedVerification, VerificationChoice, refuse_sampling, resolve_verification
from .engine.rows import RowRequest, RowResult
from .engine.schedule import Arrivals
from .engine.sequence import DecodeSettings
from .engine.stats import SpecStats
from .errors import UnsupportedGenerationError, VocabularyMismatchError
from .heads import Eagle3Head, HeadAdapter, check_head, is_head, load_head
from .hf.cache import returned_cache, row_continuations
from .hf.generation import refuse_early, resolve_generation
from .hf.model_inputs import PromptInputs, sort_inputs
from .loading import Quantization, check_model_attention, check_tokenizers, load_model
from .policies import PolicyChoice, resolve_policy
from .processors import load_processor
from .pruning import PruningConfig, resolve_pruning


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel, vocab_size: int | None = None) -> int:
    """Refuse a pair whose multimodal special tokens differ; returns how many ids the draft may propose.

    Released pairs pad their output heads to different sizes (Qwen2.5-VL 7B 152064 rows, 3B 151936): only ids
    below both heads, and below `vocab_size` (the tokenizer's length) when known, are real tokens of both.
    """
    target_vocab = target.get_output_embeddings().weight.shape[0]
    # A head proposes over the target's vocabulary (its draft vocabulary mapped into it).
    draft_vocab = (
        draft.head_config.vocab_size if isinstance(draft, Eagle3Head) else draft.get_output_embeddings().weight.shape[0]
    )
    if vocab_size is not None and vocab_size > min(target_vocab, draft_vocab):
        raise VocabularyMismatchError(
            f"the tokenizer has {vocab_size} tokens but the target's head has {target_vocab} "
            f"and the draft's {draft_vocab}"
        )
    for name in adapter_for(target).special_token_attributes:
        t, d = _config_value(target.config, name), _config_value(draft.config, name)
        if t is not None and d is not None and t != d:
            raise VocabularyMismatchError(f"{name} is {d} in the draft but {t} in the target")
    return min(vocab_size or target_vocab, target_vocab, draft_vocab)


def _runners(
    target: PreTrainedModel, draft: PreTrainedModel | Eagle3Head, compile: str | bool, guard: CompileGuard
) -> tuple[ModelRunner, ModelRunner]:
    """The target's runner and the drafter's: a VLM's own, or a head's (`HeadRunner`, bound to the target's
    embeddings and checked against it), the target's forwards then keeping the features the head reads
    (`FeatureTap`)."""
    target_adapter = adapter_for(target)
    tap = None
    if isinstance(draft, Eagle3Head):
        layers = check_head(draft, target)
        if not draft.bound:
            draft.bind(target.get_input_embeddings())
        tap = FeatureTap.on(target_adapter.language_model, layers)
        drafter = HeadRunner(HeadAdapter(draft, target_adapter), compiled_forward(draft, compile, "draft"), guard)
    else:
        drafter = ModelRunner(adapter_for(draft), compiled_forward(draft, compile, "draft"), guard, "draft")
    target_forward = compiled_forward(target, compile, "target")
    return ModelRunner(target_adapter, target_forward, guard, "target", row_depths=True, tap=tap), drafter


def _config_value(config: Any, name: str) -> Any:
    """`name` from a model config, looking into its text config too (Qwen3-VL nests its token ids)."""
    value = getattr(config, name, None)
    if value is None and hasattr(config, "get_text_config"):
        value = getattr(config.get_text_config(), name, None)
    return value


class SpeculativeVLM:
    """Drop-in for `target.generate`: the same token ids, with fewer target forwards.

    Decoding follows the target's own generation config, greedy or sampled (temperature, top-k, top-p, min-p, ...,
    drawn exactly from the target's distribution), with its logits processors applied to the draft's proposals too.

    `policy` is `"auto"` (default: SAGE's trees for a sequence decoded alone, chains for sequences decoded together),
    `"sage"`, `"sage-gt"`, `"heterospec"` (SAGE's trees extended and cut by the pair's calibrated path-entropy bins,
    `vlmspec calibrate`), `"confidence"` (chains as long as the draft's mixed confidence says), `"chain"`,
    `"static-tree"`, one of their configs or a `TreePolicy`. `pruning`
    (`"auto"` by default: `"verifier"` for a VLM draft, None for a draft head; `"verifier"`, `"uniform"`, `"random"`,
    a `PruningConfig` or None) cuts the visual tokens the draft sees; `prune_ratio` is the share dropped (default 0.9
    with video, 0.8 for images). A left-padded batch (as the
    target's processor makes for a list of prompts) decodes all its rows together, each exactly as `generate` would
    decode it; `stream` keeps a batch full over many prompts (continuous batching).

    `compile` (`"auto"`, True/`"on"`, False/`"off"`) runs both models' decoding forwards through `torch.compile`
    at fixed shapes (CUDA graphs on a GPU), one sequence or a batch's rows; `"auto"` compiles on CUDA only, and the
    `VLMSPEC_COMPILE` environment variable overrides it. Each padded size (and, batched, each bucket of rows) compiles
    on first use; quantised or offloaded models run eager. Under
    `"auto"` a compiled forward that raises, or whose tokens differ from eager ones on a short greedy decode (checked
    once per model at first use), turns the pair eager for good with one warning; `"on"` raises instead.
    `"shapes"` runs the compiled path's fixed shapes eager, without compiling (to tell a shape bug from a compiler
    bug).

    `verification` is `"exact"` (default: the target's own output) or, lossy and greedy only, `"relaxed"` or a
    `RelaxedVerification`: draft tokens within a confidence-modulated margin of the target's top token are accepted
    too, so the output may differ from the target's (`SpecStats.differing_tokens` counts where; docs/policies.md).
    A call may pass its own `verification=`.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | Eagle3Head,
        policy: PolicyChoice = "auto",
        *,
        pruning: str | PruningConfig | None = "auto",
        prune_ratio: float | None = None,
        vocab_size: int | None = None,
        processor: Any = None,
        compile: str | bool = "auto",
        verification: VerificationChoice = "exact",
    ):
        for model in (target, draft):
            if not isinstance(model, Eagle3Head):
                adapter_for(model)  # an unsupported class is named first
        check_model_attention(target, "target")
        check_model_attention(draft, "draft")
        self.target = target
        self.draft = draft
        self.processor = processor
        self.vocab_size = vocab_size
        self.compile = compile
        self.verification = resolve_verification(verification)
        guard = CompileGuard(compile)
        self._target_runner, self._draft_runner = _runners(target, draft, compile, guard)
        if vocab_size is None and processor is not None and getattr(processor, "tokenizer", None) is not None:
            vocab_size = len(processor.tokenizer)
        vocab_limit = check_vocabularies(target, draft, vocab_size)
        self.policy = resolve_policy(policy)
        self.policy.bind(target, draft)
        self.pruning = resolve_pruning(pruning, prune_ratio, isinstance(draft, Eagle3Head))
        self._batch = BatchDecoder(
            Prefiller(
                self._target_runner,
                self._draft_runner,
                self.policy,
                vocab_limit,
                self.pruning,
                draft_input_limit=draft.get_input_embeddings().weight.shape[0],
            )
        )
        self.last_stats: SpecStats | None = None

    @property
    def compiled(self) -> bool:
        """Whether decoding forwards run compiled (either model)."""
        return self._target_runner.compiled is not None or self._draft_runner.compiled is not None

    @property
    def context_length(self) -> int | None:
        """The most tokens the target positions (prompt plus new tokens), as its text config states it."""
        return getattr(self.target.config.get_text_config(), "max_position_embeddings", None)

    def with_options(
        self,
        policy: PolicyChoice = "auto",
        pruning: str | PruningConfig | None = "auto",
        prune_ratio: float | None = None,
        verification: VerificationChoice = "exact",
    ) -> SpeculativeVLM:
        """The same models and processor with another policy, pruning or verification (nothing is loaded or
        copied)."""
        return SpeculativeVLM(
            self.target,
            self.draft,
            policy,
            pruning=pruning,
            prune_ratio=prune_ratio,
            vocab_size=self.vocab_size,
            processor=self.processor,
            compile=self.compile,
            verification=verification,
        )

    @classmethod
    def from_pretrained(
        cls,
        target: str,
        draft: str,
        *,
        policy: PolicyChoice = "auto",
        pruning: str | PruningConfig | None = "auto",
        prune_ratio: float | None = None,
        torch_dtype: torch.dtype | str | None = None,
        device_map: Any = None,
        draft_device_map: Any = None,
        target_quantization: Quantization = None,
        draft_quantization: Quantization = None,
        attn_implementation: str | None = None,
        compile: str | bool = "auto",
        verification: VerificationChoice = "exact",
        **hub_kwargs: Any,
    ) -> SpeculativeVLM:
        """Load a pair (hub ids or directories) and the target's processor; refuse tokenizers that disagree. `draft`
        may hold a draft head in the EAGLE-3 layout (docs/heads.md): it is loaded beside the target's embeddings.

        `torch_dtype=None` loads float32 when no GPU is visible (the checkpoints' bfloat16 is slow on most CPUs,
        and float32 tree verification equals one-token decoding), and the checkpoint's own dtype on a GPU.

        `device_map="auto"` spreads the target over the available GPUs; the draft goes to `draft_device_map`,
        by default the device holding the target's input embeddings.
        """
        head = is_head(draft, **hub_kwargs)
        if not head:
            check_tokenizers(target, draft, **hub_kwargs)
        if torch_dtype is None:
            torch_dtype = "auto" if torch.cuda.is_available() else torch.float32
        common = dict(torch_dtype=torch_dtype, attn_implementation=attn_implementation, **hub_kwargs)
        target_model = load_model(target, device_map=device_map, quantization=target_quantization, **common)
        if head:
            # A head computes in the target's dtype, beside the target's embeddings, which it reads.
            embeddings = target_model.get_input_embeddings().weight
            draft_model = load_head(draft, dtype=embeddings.dtype, device=embeddings.device, **hub_kwargs)
        else:
            if draft_device_map is None and device_map is not None:
                draft_device_map = {"": str(target_model.get_input_embeddings().weight.device)}
            draft_model = load_model(draft, device_map=draft_device_map, quantization=draft_quantization, **common)
        processor = load_processor(target, **hub_kwargs)
        return cls(
            target_model,
            draft_model,
            policy,
            pruning=pruning,
            prune_ratio=prune_ratio,
            vocab_size=len(processor.tokenizer),
            processor=processor,
            compile=compile,
            verification=verification,
        )

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        streamer: Any = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> torch.Tensor | GenerateDecoderOnlyOutput:
        """Generation equal to `target.generate(**inputs, **kwargs)` under the target's config.

        Greedy decoding gives the same token ids; sampling draws from the same distribution, from `generator` if
        given, else from the global RNG as `generate` does (so `torch.manual_seed` makes a call repeatable).
        `num_return_sequences=n` draws n continuations from one prefill of the prompt, decoded together as a batch's
        rows (as `generate` expands its batch), padded as `generate` pads.

        Model inputs are sorted as docs/generate-contract.md says: `inputs_embeds` (with or without ids) feed the
        target, as `generate`'s first step; `cache` (or `past_key_values`) is a cache a call returned, which the call
        goes on from (a conversation's next turn); with `return_dict_in_generate` the output's `past_key_values` is a
        `SpeculativeCache` holding the target's keys for the returned sequences, and the draft's.
        """
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        verification = self._verification(kwargs)
        refuse_early(generation_config, kwargs)
        prompt = sort_inputs(self.target, self._target_runner.adapter, input_ids, kwargs)
        # The models may have moved since they were wrapped (`spec.target.cuda()`); inputs follow them, and the
        # logits processors are built where the target's logits are.
        self._target_runner.refresh()
        self._draft_runner.refresh()
        device = self._target_runner.device
        target_inputs = _to_device(prompt.inputs, device)
        output_ids = prompt.output_ids.to(device)
        settings = resolve_generation(
            self.target,
            generation_config,
            self._with_tokenizer(kwargs),
            output_ids,
            {k: v for k, v in target_inputs.items() if k != "input_ids"},
            on_device(generator, device),
        )
        settings = with_verification(settings, verification)
        _check_rows(output_ids.shape[0], settings, streamer)
        requests = self._requests(target_inputs, output_ids, prompt, settings, streamer)
        results = self._decode_requests(requests)
        return _output(results, settings, self.target.config, self._pads(target_inputs, output_ids))

    def _requests(
        self,
        inputs: dict[str, Any],
        output_ids: torch.Tensor,
        prompt: PromptInputs,
        settings: DecodeSettings,
        streamer: Any,
    ) -> list[RowRequest]:
        """Every row's `num_return_sequences` draws (sharing the row's prefill) as sequences of their own, in
        `generate`'s row order; each goes on from its row of `prompt.cache` where there is one. The draft reads the
        ids where the target reads the caller's embeddings."""
        adapter = self._target_runner.adapter
        rows = adapter.split_rows(inputs)
        continuations = self._continuations(prompt, inputs, rows, settings)
        draft_device = self._draft_runner.device
        requests = []
        for b, row in enumerate(rows):
            draft_row = {k: v for k, v in row.items() if k != "inputs_embeds"}
            if prompt.embeddings_alone:
                # `generate` positions embeddings given alone as text: the target is given no token types.
                row = {k: v for k, v in row.items() if k != "mm_token_type_ids"}
            for i in range(settings.num_sequences):
                requests.append(
                    RowRequest(
                        (b, i),
                        row,
                        _to_device(draft_row, draft_device),
                        output_ids[b : b + 1],
                        settings.for_row(b),
                        streamer=streamer,
                        continuation=None if continuations is None else continuations[b],
                    )
                )
        return requests

    def _continuations(
        self, prompt: PromptInputs, inputs: dict[str, Any], rows: list[dict[str, Any]], settings: DecodeSettings
    ) -> list[Continuation] | None:
        """What each row goes on from, where the call gives a cache; refused where vlmspec cannot go on as `generate`
        would."""
        if prompt.cache is None:
            return None
        per_token = (*self._target_runner.adapter.token_keys, *EMBEDDING_KEYS)
        visual = sorted({k for row in rows for k, v in row.items() if k not in per_token and v is not None})
        if visual:
            raise UnsupportedGenerationError(
                f"generate(): a cache (past_key_values) with {', '.join(visual)} is not supported: going on from a "
                "cache takes the conversation's token inputs only (generate's cached turns hold their images)"
            )
        if settings.num_sequences > 1 or prompt.embeddings_alone:
            raise UnsupportedGenerationError(
                "generate(): a cache (past_key_values) with num_return_sequences > 1 or with inputs_embeds alone is "
                "not supported: pass the conversation's input_ids and one sequence per row"
            )
        lengths = [row["input_ids"].shape[1] for row in rows]
        pads = [inputs["input_ids"].shape[1] - length for length in lengths]
        return row_continuations(prompt.cache, pads, lengths, self._target_runner.adapter)

    @staticmethod
    def _pads(inputs: dict[str, torch.Tensor], output_ids: torch.Tensor) -> list[int]:
        """Each row's left padding in the returned sequences."""
        mask = inputs.get("attention_mask")
        if mask is None or output_ids.shape[1] == 0:
            return [0] * output_ids.shape[0]
        return (mask.cumsum(1) == 0).sum(1).tolist()

    def _decode_requests(self, requests: list[RowRequest]) -> list[RowResult]:
        """Decode the requests together, in their order; the first error raised for any is raised."""
        results = sorted(self._batch.run(requests, len(requests)), key=lambda r: r.key)
        for result in results:
            if result.error is not None:
                raise result.error
        self.last_stats = SpecStats.combined([r.stats for r in results], self._batch.stats)
        return results

    def _verification(self, kwargs: dict[str, Any]) -> RelaxedVerification | None:
        """The call's own `verification=` (taken out of `kwargs`), else the pair's."""
        if "verification" not in kwargs:
            return self.verification
        return resolve_verification(kwargs.pop("verification"))

    def _with_tokenizer(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`kwargs` with the pair's own tokenizer (its processor's) where none is given, for stop strings."""
        if kwargs.get("tokenizer") is not None or self.processor is None:
            return kwargs
        return {**kwargs, "tokenizer": self.processor.tokenizer}

    @torch.inference_mode()
    def stream(
        self,
        inputs: Iterable[tuple[Any, dict[str, Any]] | tuple[Any, dict[str, Any], dict[str, Any]]],
        batch_size: int = 8,
        *,
        kv_budget_gb: float | None = None,
        generation_config: GenerationConfig | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> Iterator[RowResult]:
        """Decode many prompts, up to `batch_size` at once, admitting the next as soon as one finishes (continuous
        batching); yields a `RowResult` per prompt as it finishes (`key`, `sequence` (1, L + n), `stats`, or the
        `error` that prompt raised: the others carry on).

        `inputs` yields `(key, processor output for one prompt)` or `(key, output, options)`, read lazily (media can be
        decoded ahead on other threads); `options` are that prompt's own generation arguments (e.g. its `generator`).
        Each prompt decodes exactly as `generate(**its_inputs, **kwargs, **options)` would. `kv_budget_gb` bounds
        the KV cache of the rows in flight (both models): rows wait for room, and a prompt that alone exceeds it
        fails with `MemoryBudgetError` naming the option.
        """

        if kwargs.get("streamer") is not None:
            raise ValueError("a streamer follows one sequence: stream() decodes many; use generate() for one")

        def requests() -> Iterator[RowRequest]:
            for key, item, *options in inputs:
                own = {**kwargs, **(options[0] if options else {})}
                own.setdefault("generator", generator)
                try:
                    yield self.prepare(
                        item, key=key, kv_budget_gb=kv_budget_gb, generation_config=generation_config, **own
                    )
                except Exception as error:  # noqa: BLE001 - a bad prompt is reported, the others go on
                    yield RowRequest(key, {}, {}, torch.empty(1, 0, dtype=torch.long), None, error=error)

        yield from self.decode(requests(), batch_size, kv_budget_gb=kv_budget_gb)

    @torch.inference_mode()
    def prepare(
        self,
        inputs: dict[str, Any],
        *,
        key: Any = None,
        streamer: Any = None,
        cancel: threading.Event | None = None,
        kv_budget_gb: float | None = None,
        generation_config: GenerationConfig | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> RowRequest:
        """One prompt (the processor's output for it) made ready to `decode` as `generate(**inputs, **kwargs)` would
        decode it; raises what `generate` would raise for it. `streamer` follows its tokens, `cancel` (set from any
        thread) frees its row at the next step, and `kv_budget_gb` refuses a prompt that alone would exceed it."""
        verification = self._verification(kwargs)
        self._target_runner.refresh()
        self._draft_runner.refresh()
        device, draft_device = self._target_runner.device, self._draft_runner.device
        keys = self._target_runner.adapter.input_keys
        unread = sorted(k for k in ("inputs_embeds", "cache", "past_key_values") if inputs.get(k) is not None)
        if unread:
            raise UnsupportedGenerationError(
                f"{', '.join(unread)}: a stream decodes each prompt from its processor's outputs; give embeddings or a "
                "cache to generate()"
            )
        row = _to_device({k: inputs[k] for k in keys if inputs.get(k) is not None}, device)
        settings = resolve_generation(
            self.target,
            generation_config,
            self._with_tokenizer(kwargs),
            row["input_ids"],
            {k: v for k, v in row.items() if k != "input_ids"},
            on_device(generator, device),
        )
        settings = with_verification(settings, verification)
        if settings.num_sequences != 1:
            raise ValueError("one prompt decodes one continuation here: pass num_return_sequences=1")
        if kv_budget_gb is not None:
            KVBudget(kv_budget_gb, self.target, self.draft).check(row["input_ids"].shape[1] + settings.max_new_tokens)
        return RowRequest(
            key, row, _to_device(row, draft_device), row["input_ids"], settings, streamer=streamer, cancel=cancel
        )

    @torch.inference_mode()
    def decode(
        self,
        requests: Iterable[RowRequest] | Arrivals[RowRequest],
        batch_size: int = 8,
        *,
        kv_budget_gb: float | None = None,
    ) -> Iterator[RowResult]:
        """Decode prepared requests (`prepare`), up to `batch_size` at once, yielding each as it finishes. `requests`
        may be `Arrivals`, which requests join while others decode (a server's): the loop waits for one only when none
        is in flight, and ends when it is closed."""
        self._target_runner.refresh()
        self._draft_runner.refresh()
        budget = None if kv_budget_gb is None else KVBudget(kv_budget_gb, self.target, self.draft)
        yield from self._batch.run(requests, batch_size, None if budget is None else budget.admits)

    @torch.inference_mode()
    def warm_up(
        self, max_new_tokens: int = 128, batch_size: int = 1, generation: dict | None = None, **inputs: Any
    ) -> float:
        """Compile, now, every padded size either model's decoding forwards can meet over every row bucket of batches
        up to `batch_size` rows, and the step's own compiled regions: decoding `inputs` (the processor's output for a
        prompt like those to come) `max_new_tokens` tokens at each bucket, under this pair's policy and verification,
        the target's generation config and `generation` (the keyword arguments the calls to come pass `generate`).
        Returns the seconds it took (0 when nothing runs compiled). Compiled regions otherwise compile on first use.
        The random state is left as it was: a sampled warm-up draws from a fork of it."""
        if not self.compiled:
            return 0.0
        started = time.perf_counter()
        self._target_runner.refresh()
        self._draft_runner.refresh()
        keys = self._target_runner.adapter.input_keys
        row = _to_device({k: inputs[k] for k in keys if inputs.get(k) is not None}, self._target_runner.device)
        others = {k: v for k, v in row.items() if k != "input_ids"}
        generation = dict(generation or {})
        verification = self._verification(generation)
        made = resolve_generation(
            self.target, None, {**generation, "max_new_tokens": max_new_tokens}, row["input_ids"], others
        )
        settings = with_verification(made, verification)
        request = RowRequest(0, row, _to_device(row, self._draft_runner.device), row["input_ids"], settings)
        devices = {d for d in (self._target_runner.device, self._draft_runner.device) if d.type == "cuda"}
        with torch.random.fork_rng(devices=sorted(devices, key=str)):
            self._batch.warm_up(request, LARGEST_FORWARD, batch_size)
        return time.perf_counter() - started

    def __repr__(self) -> str:
        return (
            f"SpeculativeVLM(target={type(self.target).__name__}, draft={type(self.draft).__name__}, "
            f"policy={self.policy.name}, pruning={None if self.pruning is None else self.pruning.method})"
        )


def with_verification(settings: DecodeSettings, verification: RelaxedVerification | None) -> DecodeSettings:
    """`settings` under `verification` (None: exact); relaxed verification of a sampled config is refused by name."""
    if verification is None:
        return settings
    refuse_sampling(verification, settings.sampler.do_sample)
    return replace(settings, verification=verification)


def _check_rows(prompts: int, settings: DecodeSettings, streamer: Any) -> None:
    """Refuse what `generate` would do differently from vlmspec for these rows: batched stops that only an EOS could
    pad, and a streamer over more than one sequence."""
    stopping = settings.stopping
    rows = prompts * settings.num_sequences
    if rows > 1 and settings.eos_token_ids.numel() == 0 and (stopping.strings is not None or stopping.on_host):
        raise UnsupportedGenerationError(
            "stop strings, max_time or stopping_criteria in a batch without an eos_token_id are not supported: "
            "generate pads a stopped row only after an EOS, and otherwise keeps decoding it until every row "
            "stops; pass eos_token_id, or decode the prompts one at a time (stream)"
        )
    if streamer is not None and prompts > 1:
        raise ValueError(
            "a streamer follows one sequence (transformers' streamers take batch size 1): "
            "pass one prompt to stream, or no streamer for a batch"
        )
    if streamer is not None and settings.num_sequences > 1:
        raise ValueError("a streamer follows one sequence: pass num_return_sequences=1 to stream")


def _output(
    results: list[RowResult], settings: DecodeSettings, config: Any, pads: list[int]
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """What `generate` returns for these rows: their padded sequences, or with `return_dict_in_generate` an output
    that also holds the scores and logits asked for, and the cache (`use_cache`), rows after `pads` of padding."""
    sequences = _pad([r.sequence for r in results], settings.pad_token_id)
    if settings.return_dict_in_generate:
        cache = None
        if settings.return_cache:
            cache = returned_cache(config, [r.cache for r in results], [pads[r.key[0]] for r in results])
        return GenerateDecoderOnlyOutput(
            sequences=sequences,
            scores=_per_step([r.scores for r in results]) if settings.output_scores else None,
            logits=_per_step([r.logits for r in results]) if settings.output_logits else None,
            cache=cache,
        )
    return sequences


def _pad(sequences: list[torch.Tensor], pad_token_id: int | None) -> torch.Tensor:
    """Continuations (1, L_i) stacked into (n, max L_i), the shorter ones padded on the right as `generate` does."""
    if len(sequences) == 1:
        return sequences[0]
    length = max(s.shape[1] for s in sequences)
    if pad_token_id is None and any(s.shape[1] < length for s in sequences):
        raise ValueError("continuations of different lengths need a pad_token_id (or eos_token_id) to pad with")
    padded = sequences[0].new_full((len(sequences), length), 0 if pad_token_id is None else pad_token_id)
    for i, s in enumerate(sequences):
        padded[i, : s.shape[1]] = s[0]
    return padded


def _per_step(rows: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """Each row's per-token tensors (1, V) as `generate` returns them: one (rows, V) tensor per step, zeros where a
    row had already finished (`generate` fills those with the scores of its padding, which no row decodes here)."""
    steps = max(len(row) for row in rows)
    out = []
    for i in range(steps):
        present = next(row[i] for row in rows if len(row) > i)
        out.append(torch.cat([row[i] if len(row) > i else torch.zeros_like(present) for row in rows]))
    return tuple(out)


def on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device` for sampling where the logits are: `generator` itself if it is there already, else
    one seeded by a draw from it, so the same seed still gives the same output and no step copies a
    vocabulary-sized row to the generator's device."""
    if generator is None or torch.device(generator.device) == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def _to_device(inputs: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
