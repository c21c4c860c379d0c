"""What a decoding step costs at the released sizes, on random-weight models built from the released configs.

Per pair (Qwen2.5-VL-7B + 3B, Qwen3-VL-8B + 2B, LLaVA-OneVision 7b + 0.5b, as the README pairs them) it prints:
plain `generate` ms per token; the target's verification ms for trees of --nodes nodes over a cache of each of
--contexts tokens; the draft's ms per tree level of --widths tokens; vlmspec's own ms per step outside the two
models' forwards, per policy; HF assisted generation's ms per step on the same pair; and, stated as a projection,
each policy's speedup over plain `generate` with the acceptance lengths the SAGE paper reports for the family, and the
own ms per step at which that projection breaks even (what vlmspec's own work must fall below to beat `generate`).
Prompts are random text tokens (a cache of L tokens costs the same whatever filled it); every run is greedy.
Attention is the models' default, SDPA (vlmspec's tree attention in its own forwards). With --compile on, plain
`generate` runs with a static cache compiled by `torch.compile` and the verification and draft-level forwards run
compiled at fixed shapes (CUDA graphs on a GPU; each size is compiled by the first, untimed, repeat); vlmspec's own
ms per step is always measured eager, where its forward hooks see every forward.

Usage, on a GPU: .venv/bin/python scripts/step_costs.py --device cuda [--pairs qwen2_5_vl,qwen3_vl,llava_onevision]
At the replicas' tiny sizes on the CPU: --scale tiny --device cpu --dtype float32 --contexts 64,128
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
from vlmspec.device_tensors import host_values
from vlmspec.engine.compiled import compiled_forward
from vlmspec.engine.model_runner import ModelRunner
from vlmspec.engine.tree import Tree, with_edges
from vlmspec.eval.bench import compiled_generate_config
from vlmspec.testing import REPLICA_PAIRS, replica_config
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
    result = []
    for width in widths:
        tokens = random_ids(width, runner.device, seed=width, high=regular_ids(model))
        depths = torch.ones(width, dtype=torch.long, device=runner.device)
        visible = with_edges(torch.eye(width, dtype=torch.bool, device=runner.device))
        result.append(
            rewound_ms(
                runner, lambda start, t=tokens, d=depths, v=visible: runner.forward_rows(t, d, start, v), repeats
            )
        )
    return result


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
    """Every cost of `name`'s pair; `save(result)` is called after each measurement with what is known so far, so a
    run stopped part-way keeps what it measured (plain `generate` first, then verification, then the draft)."""
    pair = REPLICA_PAIRS[name]
    target = build(pair.target, args.scale, device, dtype)
    draft = build(pair.draft, args.scale, device, dtype)
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
        if args.assisted:
            row["hf_assisted_ms_per_step"] = assisted_ms_per_step(target, draft, context, args.new_tokens, args.repeats)
            save(result)
    own = {}
    for policy in POLICIES:
        own[policy] = own_ms_per_step(target, draft, policy, contexts[0], args.new_tokens, args.repeats)
        result["own_ms_per_step"][policy] = {"ms": own[policy][0], "steps": own[policy][1]}
        save(result)
    for row in result["contexts"].values():
        row["projection"] = {
            policy: dict(zip(("ms_per_step", "speedup", "own_break_even_ms"), values, strict=True))
            for policy, values in projection(name, row, nodes, widths, own).items()
        }
    save(result)
    del target, draft
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def projection(name: str, row: dict, nodes: list[int], widths: list[int], own: dict) -> dict:
    """Per policy: projected ms per step (its drafting and verification interpolated from the measured costs, plus
    its measured own time), speedup `(1 + tau) * generate ms per token / ms per step` at the paper's tau, and the own
    time per step at which that speedup would be exactly 1 (`(1 + tau) * generate ms per token - drafting -
    verification`: what vlmspec's own work must fall below to beat plain `generate`; negative when the forwards alone
    already lose)."""
    taus = PAPER_TAU[name]
    result = {}
    for policy, (level_widths, verified) in PROJECTED_STEPS.items():
        drafting = sum(float(np.interp(w, widths, row["draft_level_ms"])) for w in level_widths)
        forwards = drafting + float(np.interp(verified, nodes, row["verify_ms"]))
        step = forwards + own[policy][0]
        if policy in taus:
            budget = (1 + taus[policy]) * row["ar_ms_per_token"]
            result[policy] = (step, budget / step, budget - forwards)
        else:
            result[policy] = (step, None, None)
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
    return "\n".join(lines + break_even_lines(result)) + "\n"


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
    args = parser.parse_args(argv)
    unknown = set(args.pairs) - set(PAIRS)
    if unknown:
        parser.error(f"unknown pairs {sorted(unknown)}; choose from {', '.join(PAIRS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    results: dict = {}

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
