"""What a decoding step costs at the released sizes, on random-weight models built from the released configs.

Per pair (Qwen2.5-VL-7B + 3B, Qwen3-VL-8B + 2B, LLaVA-OneVision 7b + 0.5b, as the README pairs them) it prints:
plain `generate` ms per token; the target's verification ms for trees of --nodes nodes over a cache of each of
--contexts tokens; the draft's ms per tree level of --widths tokens; vlmspec's own ms per step outside the two
models' forwards, per policy; HF assisted generation's ms per step on the same pair; and, stated as a projection,
each policy's speedup over plain `generate` with the acceptance lengths the SAGE paper reports for the family, and the
own ms per step at which that projection breaks even (what vlmspec's own work must fall below to beat `generate`).
For the Qwen pairs it also measures a draft head in the released heads' shape (one layer of the target's width, a 32k
draft vocabulary; random weights): its ms per tree level beside the draft's, vlmspec's own ms per step with it, and
its projection at the paper's tau and at the released heads' (SGLang's 3.18 for Qwen2.5-VL-7B, AngelSlim's 2.0-2.6
for Qwen3-VL) (`--no-heads` leaves it out). `--arithmetic` prints, instead of timing anything, the bytes each forward
reads at the released sizes, the draft forwards a step takes and the memory-bound speedup they allow.
Prompts are random text tokens (a cache of L tokens costs the same whatever filled it); every run is greedy.
Attention is the models' default, SDPA (vlmspec's tree attention in its own forwards). With --compile on, plain
`generate` runs with a static cache compiled by `torch.compile` and the verification and draft-level forwards run
compiled at fixed shapes (CUDA graphs on a GPU; each size is compiled by the first, untimed, repeat); vlmspec's own
ms per step is always measured eager, where its forward hooks see every forward.

Usage, on a GPU: .venv/bin/python scripts/step_costs.py --device cuda [--pairs qwen2_5_vl,qwen3_vl,llava_onevision]
At the replicas' tiny sizes on the CPU: --scale tiny --device cpu --dtype float32 --contexts 64,128
The arithmetic, anywhere: .venv/bin/python scripts/step_costs.py --arithmetic
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from overhead import ForwardClock
from transformers import AutoConfig, PreTrainedModel

from vlmspec import SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.adapters.base import FEATURE_KEY
from vlmspec.device_tensors import host_values
from vlmspec.engine.compiled import compiled_forward
from vlmspec.engine.head_runner import HeadRunner
from vlmspec.engine.model_runner import ModelRunner
from vlmspec.engine.tree import Tree, with_edges
from vlmspec.eval.bench import compiled_generate_config
from vlmspec.heads import Eagle3Head
from vlmspec.heads.adapter import HeadAdapter
from vlmspec.heads.new import head_config_for
from vlmspec.testing import REPLICA_PAIRS, replica_config
from vlmspec.testing.heads import random_head
from vlmspec.testing.released_files import RELEASED

PAIRS = ("qwen2_5_vl", "qwen3_vl", "llava_onevision")
POLICIES = ("chain", "static-tree", "sage")
#: Acceptance lengths tau on VideoDetailedCaption in the SAGE paper: Table 2 (Qwen2.5-VL 72B-7B), Table 3
#: (Qwen3-VL 235B-A22B with an 8B draft; no chain reported) and Table 1 (LLaVA-OneVision 72B-8B).
PAPER_TAU = {
    "qwen2_5_vl": {"chain": 3.67, "static-tree": 4.18, "sage": 5.18},
    "qwen3_vl": {"static-tree": 3.58, "sage": 4.39},
    "llava_onevision": {"chain": 3.10, "static-tree": 4.21, "sage": 5.74},
}
#: The step each policy takes in the projection: the widths of its draft forwards (the pending tokens, then every
#: level but the last) and the nodes it verifies, root included. Chain: 5 tokens; static tree: SpecVLM's 25 nodes
#: in levels of 4, 8, 8, 3, 2; SAGE at its caps (D_max 8, N_max 64).
PROJECTED_STEPS = {
    "chain": ([2, 1, 1, 1, 1], 6),
    "static-tree": ([2, 4, 8, 8, 3], 26),
    "sage": ([2, 9, 9, 9, 9, 9, 9, 9], 64),
}
#: Acceptance lengths of the released heads, in their own engines: SGLang's run of the SpecForge Qwen2.5-VL-7B head
#: (3.18) and AngelSlim's Qwen3-VL heads (2.0-2.6 on MMMU and MMStar; the top of the range). LLaVA-OneVision has
#: none. The projection applies each to every policy's step, as no policy was named with them.
RELEASED_HEAD_TAU = {"qwen2_5_vl": 3.18, "qwen3_vl": 2.6}
#: The released heads' draft vocabulary (SpecForge's and AngelSlim's configs).
HEAD_DRAFT_VOCAB = 32000
#: Token ids below every special token of the Qwen2 tokenizers, for random prompts and trees.
REGULAR_IDS = 150000


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    return torch.cuda.synchronize if device.type == "cuda" else None


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `fn()` over `repeats` runs, after one warm-up, waiting for the device each time."""
    sync = synchronizer(device) or (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def build(checkpoint: str, scale: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """A random-weight model of `checkpoint`'s released config (`scale="tiny"`: the replica's sizes), on `device`."""
    config_json = RELEASED[checkpoint]["config.json"] if scale == "released" else replica_config(checkpoint)
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "config.json").write_text(json.dumps(config_json))
        config = AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, config_json["architectures"][0])
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype)
    return model.eval()


def random_ids(length: int, device: torch.device, seed: int = 0, high: int = REGULAR_IDS) -> torch.Tensor:
    """`(1, length)` random token ids below `high`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (1, length), generator=generator).to(device)


def regular_ids(model: PreTrainedModel) -> int:
    """How many leading ids of `model`'s vocabulary are ordinary tokens (all of a small test vocabulary)."""
    return min(REGULAR_IDS, model.config.get_text_config().vocab_size)


def k_ary_tree(n: int, device: torch.device, k: int = 4, high: int = REGULAR_IDS) -> Tree:
    """A tree of `n` nodes (root included) in which every node has up to `k` children, level by level, holding
    random ids below `high`."""
    parents = [-1] + [(i - 1) // k for i in range(1, n)]
    ancestors = torch.eye(n, dtype=torch.bool)
    depths = [0] * n
    for i in range(1, n):
        ancestors[i] |= ancestors[parents[i]]
        depths[i] = depths[parents[i]] + 1
    return Tree(
        tokens=random_ids(n, device, seed=n, high=high)[0],
        parents=torch.tensor(parents, device=device),
        depths=torch.tensor(depths, device=device),
        log_probs=torch.zeros(n, device=device),
        ancestors=ancestors.to(device),
        depth=max(depths),
    )


def prefilled(model: PreTrainedModel, context: int, compile: str = "off") -> ModelRunner:
    """A batch of one whose row holds a prompt of `context` random tokens (its forwards compiled as `compile` says)."""
    adapter = adapter_for(model)
    runner = ModelRunner(adapter, compiled_forward(model, compile, "model"))
    _, prompt = runner.prefill({"input_ids": random_ids(context, runner.device, high=regular_ids(model))}, room=0)
    runner.take(prompt, room=0)
    return runner


def rewound_ms(runner: ModelRunner, forward: Callable[[torch.Tensor], object], repeats: int) -> float:
    """Median ms of `forward(start)` over `runner`'s row, whose next token's position is `start` (1,) and whose cache
    is put back to what it held before after each run."""
    lengths = list(runner.lengths)
    start = host_values(runner.positions(lengths), runner.device)

    def run() -> None:
        forward(start)
        runner.cache.lengths = list(lengths)

    return timed(run, runner.device, repeats)


def verification_ms(
    model: PreTrainedModel, context: int, nodes: list[int], repeats: int, compile: str = "off"
) -> list[float]:
    """The target's forward over a tree of each size in `nodes`, after a cache of `context` tokens."""
    runner = prefilled(model, context, compile)
    trees = [k_ary_tree(n, runner.device, high=regular_ids(model)) for n in nodes]
    return [
        rewound_ms(
            runner,
            lambda start, tree=tree: runner.forward_rows(
                tree.tokens[None], tree.depths, start, with_edges(tree.ancestors)
            ),
            repeats,
        )
        for tree in trees
    ]


def level_ms(
    model: PreTrainedModel, context: int, widths: list[int], repeats: int, compile: str = "off"
) -> list[float]:
    """The draft's forward over one tree level of each width in `widths`, after a cache of `context` tokens."""
    runner = prefilled(model, context, compile)
    return levels_ms(runner, widths, repeats, regular_ids(model))


def levels_ms(runner: ModelRunner, widths: list[int], repeats: int, high: int) -> list[float]:
    """`runner`'s forward over one tree level (children of the root) of each width in `widths`, random ids below
    `high`, its cache put back after each."""
    result = []
    for width in widths:
        tokens = random_ids(width, runner.device, seed=width, high=high)
        depths = torch.ones(width, dtype=torch.long, device=runner.device)
        visible = with_edges(torch.eye(width, dtype=torch.bool, device=runner.device))
        result.append(
            rewound_ms(
                runner, lambda start, t=tokens, d=depths, v=visible: runner.forward_rows(t, d, start, v), repeats
            )
        )
    return result


def released_head_options(target: PreTrainedModel) -> dict:
    """`head_config_for`'s options for a head in the released heads' shape: one layer of the target's width, heads
    and MLP, a 32k draft vocabulary, reading the default layers (the lowest, middle and last of a target too shallow
    for them)."""
    text = target.config.get_text_config()
    vocab = target.get_output_embeddings().weight.shape[0]
    layers = text.num_hidden_layers
    layer_ids = None if layers >= 6 else [0, layers // 2, layers - 1]
    return dict(draft_vocab=min(HEAD_DRAFT_VOCAB, vocab), layer_ids=layer_ids, intermediate_size=text.intermediate_size)


def weight_bytes(model: PreTrainedModel | Eagle3Head, first_forward: bool = True) -> int:
    """Bytes of weights one decoding forward of `model` reads: a model's language model and output layer, less its
    input embeddings (a forward reads only its tokens' rows) unless they are the output layer too; a head's layer,
    norm and output layer, and its `fc` only in a step's first forward (a level reads the head's own outputs)."""
    if isinstance(model, Eagle3Head):
        skipped = set() if first_forward else {id(model.fc.weight)}
        return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skipped)
    parameters = {id(p): p for p in adapter_for(model).language_model.parameters()}
    parameters.update({id(p): p for p in model.get_output_embeddings().parameters()})
    embedding = model.get_input_embeddings().weight
    if embedding is not model.get_output_embeddings().weight:
        parameters.pop(id(embedding), None)
    return sum(p.numel() * p.element_size() for p in parameters.values())


def cache_bytes(model: PreTrainedModel | Eagle3Head, context: int) -> int:
    """Bytes of keys and values one forward reads over a cache of `context` entries."""
    config = model.config.get_text_config() if not isinstance(model, Eagle3Head) else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context * element


def arithmetic(name: str, contexts: list[int], dtype: torch.dtype = torch.bfloat16) -> dict:
    """Per context and policy, at the released sizes (models built on the meta device: nothing is allocated): bytes
    a verification reads (the target's weights and cache: a memory-bound forward reads them once, whatever the tree),
    bytes the step's drafting reads with the draft model and with a released-shape head (each forward its weights and
    cache), the step's draft forwards, and the memory-bound speedup `(1 + tau) * verification / (verification +
    drafting)` at the paper's tau and, for the head, at the released head's."""
    pair = REPLICA_PAIRS[name]
    target, draft = (
        build(checkpoint, "released", torch.device("meta"), dtype) for checkpoint in (pair.target, pair.draft)
    )
    head = None
    if name in RELEASED_HEAD_TAU:
        with torch.device("meta"):
            head = Eagle3Head(head_config_for(target, **released_head_options(target))).to(dtype)
    result = {}
    for context in contexts:
        verify = weight_bytes(target) + cache_bytes(target, context)
        row = result[context] = {
            "verify_bytes": verify,
            "draft_level_bytes": weight_bytes(draft) + cache_bytes(draft, context),
        }
        if head is not None:
            row["head_level_bytes"] = weight_bytes(head, first_forward=False) + cache_bytes(head, context)
            row["head_first_bytes"] = weight_bytes(head) + cache_bytes(head, context)
        for policy, (widths, _) in PROJECTED_STEPS.items():
            forwards = len(widths)
            cell = row[policy] = {"forwards": forwards, "draft_bytes": forwards * row["draft_level_bytes"]}
            cell["draft_speedup"] = _bound(PAPER_TAU[name].get(policy), verify, cell["draft_bytes"])
            if head is not None:
                cell["head_bytes"] = row["head_first_bytes"] + (forwards - 1) * row["head_level_bytes"]
                cell["head_speedup"] = _bound(PAPER_TAU[name].get(policy), verify, cell["head_bytes"])
                cell["head_speedup_released_tau"] = _bound(RELEASED_HEAD_TAU[name], verify, cell["head_bytes"])
    return result


def _bound(tau: float | None, verify: int, drafting: int) -> float | None:
    """The memory-bound speedup of a step that emits `1 + tau` tokens for a verification and its drafting."""
    return None if tau is None else (1 + tau) * verify / (verify + drafting)


def head_level_ms(
    target: PreTrainedModel, head: Eagle3Head, context: int, widths: list[int], repeats: int, compile: str = "off"
) -> list[float]:
    """The head's forward over one tree level of each width in `widths` (every node beside its parent's output, the
    root's), after a cache of `context` entries made from zero features."""
    runner = HeadRunner(HeadAdapter(head, adapter_for(target)), compiled_forward(head, compile, "draft"))
    ids = random_ids(context + 1, runner.device, high=regular_ids(target))
    features = torch.zeros(1, context + 1, 3 * head.head_config.hidden_size, dtype=runner.dtype, device=runner.device)
    _, prompt = runner.prefill({"input_ids": ids, FEATURE_KEY: features}, room=0)
    runner.take(prompt, room=0)
    one = torch.zeros(1, dtype=torch.long, device=runner.device)
    rewound_ms(runner, lambda start: runner.forward_rows(ids[:, -1:], one, start, None, features=features[:, -1:]), 1)
    return levels_ms(runner, widths, repeats, regular_ids(target))


def generate_ms(model: PreTrainedModel, ids: torch.Tensor, new_tokens: int, repeats: int, **kwargs) -> float:
    settings = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    return timed(lambda: model.generate(input_ids=ids, **settings), ids.device, repeats)


def ar_ms_per_token(model: PreTrainedModel, context: int, new_tokens: int, repeats: int, compile: str = "off") -> float:
    """Plain `generate`'s ms per token after a prompt of `context` tokens (its prefill taken out); compiled, with a
    static cache."""
    ids = random_ids(context, model.device)
    extra = {} if compile == "off" else dict(cache_implementation="static", compile_config=compiled_generate_config())
    full, prefill = (generate_ms(model, ids, n, repeats, **extra) for n in (new_tokens, 1))
    return (full - prefill) / (new_tokens - 1)


def assisted_ms_per_step(
    target: PreTrainedModel, draft: PreTrainedModel, context: int, new_tokens: int, repeats: int
) -> float | str:
    """HF assisted generation's ms per target forward after a prompt of `context` tokens (its prefill taken out)."""
    ids = random_ids(context, target.device)
    clock = ForwardClock(target)
    try:
        total = generate_ms(target, ids, new_tokens, repeats, assistant_model=draft)
    except (ValueError, TypeError, RuntimeError) as error:
        return f"refused: {str(error).splitlines()[0][:80]}"
    finally:
        clock.remove()
    steps = clock.calls / (repeats + 1) - 1
    return (total - generate_ms(target, ids, 1, repeats)) / max(1.0, steps)


def own_ms_per_step(
    target: PreTrainedModel, draft: PreTrainedModel, policy: str, context: int, new_tokens: int, repeats: int
) -> tuple[float, float]:
    """vlmspec's ms per step outside both models' forwards (the forwards timed to the device), and its steps."""
    spec = SpeculativeVLM(target, draft, policy=policy, pruning=None, compile="off")
    ids = random_ids(context, target.device)
    clock = ForwardClock(target, draft, synchronize=synchronizer(target.device))
    settings = dict(input_ids=ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    spec.generate(**settings)
    own, steps = [], 0
    for _ in range(repeats):
        clock.seconds = 0.0
        start = time.perf_counter()
        spec.generate(**settings)
        wall = time.perf_counter() - start
        steps = spec.last_stats.iterations
        own.append(1000 * (wall - clock.seconds) / max(1, steps))
    clock.remove()
    return statistics.median(own), steps


def report_pair(
    name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, save: Callable[[dict], None]
) -> dict:
    """Every cost of `name`'s pair, and of a released-shape head for its target where heads are released for the
    family; `save(result)` is called after each measurement with what is known so far, so a run stopped part-way
    keeps what it measured (plain `generate` first, then verification, the draft's level and the head's)."""
    pair = REPLICA_PAIRS[name]
    target = build(pair.target, args.scale, device, dtype)
    draft = build(pair.draft, args.scale, device, dtype)
    head = random_head(target, **released_head_options(target)) if args.heads and name in RELEASED_HEAD_TAU else None
    contexts, nodes, widths = args.contexts, args.nodes, args.widths
    result: dict = {"contexts": {}, "own_ms_per_step": {}}
    for context in contexts:
        row = result["contexts"][context] = {}
        row["ar_ms_per_token"] = ar_ms_per_token(target, context, args.new_tokens, args.repeats, args.compile)
        save(result)
        row["verify_ms"] = verification_ms(target, context, nodes, args.repeats, args.compile)
        save(result)
        row["draft_level_ms"] = level_ms(draft, context, widths, args.repeats, args.compile)
        save(result)
        if head is not None:
            row["head_level_ms"] = head_level_ms(target, head, context, widths, args.repeats, args.compile)
            save(result)
        if args.assisted:
            row["hf_assisted_ms_per_step"] = assisted_ms_per_step(target, draft, context, args.new_tokens, args.repeats)
            save(result)
    own = {}
    for policy in POLICIES:
        own[policy] = own_ms_per_step(target, draft, policy, contexts[0], args.new_tokens, args.repeats)
        result["own_ms_per_step"][policy] = {"ms": own[policy][0], "steps": own[policy][1]}
        save(result)
    for row in result["contexts"].values():
        row["projection"] = projection(row, nodes, widths, own, PAPER_TAU[name], "draft_level_ms")
    save(result)
    if head is not None:
        report_head(name, target, head, args, result, save)
    del target, draft, head
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def report_head(
    name: str,
    target: PreTrainedModel,
    head: Eagle3Head,
    args: argparse.Namespace,
    result: dict,
    save: Callable[[dict], None],
) -> None:
    """The head's costs beside the draft's, into `result`, its levels already measured: vlmspec's own ms per step
    with it, and its projection at the paper's tau and at the released head's."""
    own = {}
    for policy in POLICIES:
        own[policy] = own_ms_per_step(target, head, policy, args.contexts[0], args.new_tokens, args.repeats)
        result.setdefault("head_own_ms_per_step", {})[policy] = {"ms": own[policy][0], "steps": own[policy][1]}
        save(result)
    released = dict.fromkeys(POLICIES, RELEASED_HEAD_TAU[name])
    for row in result["contexts"].values():
        row["head_projection"] = {
            "paper": projection(row, args.nodes, args.widths, own, PAPER_TAU[name], "head_level_ms"),
            "released head": projection(row, args.nodes, args.widths, own, released, "head_level_ms"),
        }
    save(result)


def projection(row: dict, nodes: list[int], widths: list[int], own: dict, taus: dict, levels: str) -> dict:
    """Per policy: projected ms per step (its drafting, from the measured `row[levels]` ms per level, and verification
    interpolated from the measured costs, plus its measured own time), speedup `(1 + tau) * generate ms per token /
    ms per step` at `taus[policy]`, and the own time per step at which that speedup would be exactly 1 (`(1 + tau) *
    generate ms per token - drafting - verification`: what vlmspec's own work must fall below to beat plain
    `generate`; negative when the forwards alone already lose)."""
    result = {}
    for policy, (level_widths, verified) in PROJECTED_STEPS.items():
        drafting = sum(float(np.interp(w, widths, row[levels])) for w in level_widths)
        forwards = drafting + float(np.interp(verified, nodes, row["verify_ms"]))
        step = forwards + own[policy][0]
        values = (step, None, None)
        if policy in taus:
            budget = (1 + taus[policy]) * row["ar_ms_per_token"]
            values = (step, budget / step, budget - forwards)
        result[policy] = dict(zip(("ms_per_step", "speedup", "own_break_even_ms"), values, strict=True))
    return result


def markdown(name: str, result: dict, args: argparse.Namespace) -> str:
    pair = REPLICA_PAIRS[name]
    compiled = "compiled" if args.compile == "on" else "not compiled"
    lines = [f"## {pair.target} + {pair.draft} ({args.scale} sizes, {args.dtype}, {args.device}, {compiled})", ""]
    lines += [
        "| context | generate ms/token | "
        + " | ".join(f"verify {n} ms" for n in args.nodes)
        + " | "
        + " | ".join(f"draft level {w} ms" for w in args.widths)
        + " | HF assisted ms/step |",
        "| --- " * (3 + len(args.nodes) + len(args.widths)) + "|",
    ]
    for context, row in result["contexts"].items():
        assisted = row.get("hf_assisted_ms_per_step", "not measured")
        lines.append(
            f"| {context} | {row['ar_ms_per_token']:.2f} | "
            + " | ".join(f"{v:.2f}" for v in row["verify_ms"] + row["draft_level_ms"])
            + f" | {assisted if isinstance(assisted, str) else f'{assisted:.2f}'} |"
        )
    lines += ["", f"vlmspec's own ms per step outside the forwards (context {args.contexts[0]}):", ""]
    lines += ["| policy | ms/step | steps |", "| --- | --- | --- |"]
    lines += [f"| {p} | {o['ms']:.2f} | {o['steps']} |" for p, o in result["own_ms_per_step"].items()]
    taus = PAPER_TAU[name]
    lines += ["", "Projection at the SAGE paper's tau (" + ", ".join(f"{p} {t}" for p, t in taus.items()) + "):", ""]
    lines += ["| context | " + " | ".join(f"{p} ms/step | {p} speedup" for p in POLICIES) + " |"]
    lines += ["| --- " * (1 + 2 * len(POLICIES)) + "|"]
    for context, row in result["contexts"].items():
        cells = []
        for policy in POLICIES:
            projected = row["projection"][policy]
            speedup = "n/a" if projected["speedup"] is None else f"{projected['speedup']:.2f}x"
            cells += [f"{projected['ms_per_step']:.2f}", speedup]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    return "\n".join(lines + break_even_lines(result) + head_lines(name, result, args)) + "\n"


def arithmetic_markdown(name: str, result: dict) -> str:
    """`arithmetic`'s table for one pair."""
    pair = REPLICA_PAIRS[name]
    head = f", a head also at the released head's tau {RELEASED_HEAD_TAU[name]}" if name in RELEASED_HEAD_TAU else ""
    lines = [f"## {pair.target} + {pair.draft} or a head: bytes read, released sizes, bfloat16", ""]
    lines += [f"Memory-bound speedup `(1 + tau) x verification / (verification + drafting)` at the paper's tau{head}."]
    lines += [
        "",
        "| context | policy | draft forwards/step | verification GB | draft GB/step | head GB/step | "
        "speedup: draft | head | head at released tau |",
        "| --- " * 9 + "|",
    ]
    for context, row in result.items():
        for policy in POLICIES:
            cell = row[policy]
            sizes = [f"{row['verify_bytes'] / 1e9:.2f}"] + [_gb(cell.get(k)) for k in ("draft_bytes", "head_bytes")]
            speedups = [_times(cell.get(k)) for k in ("draft_speedup", "head_speedup", "head_speedup_released_tau")]
            lines.append(f"| {context} | {policy} | {cell['forwards']} | " + " | ".join(sizes + speedups) + " |")
    context, first = next(iter(result.items()))
    per_level = f"draft level {_gb(first['draft_level_bytes'])} GB"
    if "head_level_bytes" in first:
        per_level += (
            f", head level {_gb(first['head_level_bytes'], 3)} GB (first {_gb(first['head_first_bytes'], 3)} GB)"
        )
    return "\n".join([*lines, "", f"Per forward at {context} tokens: {per_level}."]) + "\n"


def _gb(value: int | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value / 1e9:.{digits}f}"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def head_lines(name: str, result: dict, args: argparse.Namespace) -> list[str]:
    """The head's tables: its ms per tree level beside the draft's, vlmspec's own ms per step with it, and its
    projected speedup at the paper's tau and at the released head's, beside the draft's at the paper's."""
    if "head_own_ms_per_step" not in result:
        return []
    lines = ["", f"A head in the released shape (one layer, {HEAD_DRAFT_VOCAB} draft tokens), ms per tree level:", ""]
    lines += ["| context | " + " | ".join(f"head level {w} ms | draft level {w} ms" for w in args.widths) + " |"]
    lines += ["| --- " * (1 + 2 * len(args.widths)) + "|"]
    for context, row in result["contexts"].items():
        cells = [f"{h:.2f} | {d:.2f}" for h, d in zip(row["head_level_ms"], row["draft_level_ms"], strict=True)]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    own = result["head_own_ms_per_step"]
    lines += ["", "vlmspec's own ms per step with the head: " + ", ".join(f"{p} {o['ms']:.2f}" for p, o in own.items())]
    tau = RELEASED_HEAD_TAU[name]
    lines += ["", f"Projected speedup over plain `generate`, head at the paper's tau and at the released head's {tau}:"]
    lines += ["", "| context | " + " | ".join(f"{p}: draft | head | head at {tau}" for p in POLICIES) + " |"]
    lines += ["| --- " * (1 + 3 * len(POLICIES)) + "|"]
    for context, row in result["contexts"].items():
        cells = []
        for policy in POLICIES:
            speedups = [
                row["projection"][policy],
                *(row["head_projection"][k][policy] for k in ("paper", "released head")),
            ]
            cells += ["n/a" if s["speedup"] is None else f"{s['speedup']:.2f}x" for s in speedups]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    return lines


def break_even_lines(result: dict) -> list[str]:
    """The table of what vlmspec's own ms per step must fall below for each policy to beat plain `generate`."""
    rows = list(result["contexts"].values())
    policies = [p for p in POLICIES if rows and rows[0]["projection"][p]["own_break_even_ms"] is not None]
    lines = ["", "Own ms per step at which the projection breaks even with plain `generate` (measured own ms beside):"]
    lines += ["", "| context | " + " | ".join(f"{p} break-even | {p} own" for p in policies) + " |"]
    lines += ["| --- " * (1 + 2 * len(policies)) + "|"]
    for context, row in result["contexts"].items():
        cells = []
        for policy in policies:
            own = result["own_ms_per_step"][policy]["ms"]
            cells += [f"{row['projection'][policy]['own_break_even_ms']:.2f}", f"{own:.2f}"]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    return lines


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=lambda t: t.split(","), default=list(PAIRS), help="families, comma-separated")
    parser.add_argument("--scale", choices=["released", "tiny"], default="released")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--contexts", type=_ints, default=[1024, 8192, 16384], help="cache lengths in tokens")
    parser.add_argument("--nodes", type=_ints, default=[1, 4, 16, 32, 64], help="verified tree sizes")
    parser.add_argument("--widths", type=_ints, default=[1, 2, 4, 8, 16], help="draft level widths")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per generate call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the numbers as JSON here, rewritten after every measurement")
    parser.add_argument(
        "--compile", choices=["off", "on"], default="off", help="generate, verification and draft levels compiled"
    )
    parser.add_argument(
        "--no-assisted", dest="assisted", action="store_false", help="leave HF assisted generation unmeasured"
    )
    parser.add_argument(
        "--arithmetic",
        action="store_true",
        help="print only the bytes each forward reads at the released sizes and the memory-bound speedups (models "
        "built on the meta device: runs anywhere, in seconds)",
    )
    parser.add_argument(
        "--no-heads", dest="heads", action="store_false", help="leave the released-shape draft heads unmeasured"
    )
    args = parser.parse_args(argv)
    unknown = set(args.pairs) - set(PAIRS)
    if unknown:
        parser.error(f"unknown pairs {sorted(unknown)}; choose from {', '.join(PAIRS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    results: dict = {}
    if args.arithmetic:
        for name in args.pairs:
            results[name] = arithmetic(name, args.contexts)
            print(arithmetic_markdown(name, results[name]), flush=True)
        return results

    def save(pair: str, result: dict) -> None:
        results[pair] = result
        if args.out:
            document = {"settings": vars(args), "pairs": results}
            Path(args.out).write_text(json.dumps(document, indent=1, default=str))

    with torch.inference_mode():
        for name in args.pairs:
            report_pair(name, args, device, dtype, lambda result, name=name: save(name, result))
            print(markdown(name, results[name], args), flush=True)
    return results


if __name__ == "__main__":
    main()
