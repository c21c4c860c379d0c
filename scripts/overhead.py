"""Share of wall time spent outside model forwards (tree building, acceptance, cache bookkeeping, policy).

Times every top-level forward of the target and the draft with hooks while each policy decodes the benchmark
suite's items; what is left of the wall time is the decoder's own overhead. Runs on the demo pair by default
(`--fixture`: the tiny test fixture with the target as its own draft).
Usage: .venv/bin/python scripts/overhead.py [--suite image|video] [--n N] [--max-new-tokens N] [--fixture]
"""

from __future__ import annotations

import argparse
import time

import torch

from vlmspec import SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.eval.bench import suite_inputs
from vlmspec.testing import chat_inputs, sample_image, tiny_processor, tiny_qwen2_5_vl

POLICIES = ("chain", "static-tree", "sage", "sage-gt")


class ForwardClock:
    """Wall time spent inside the forwards of the given models (nested calls counted once); with `synchronize`
    (on a GPU: `torch.cuda.synchronize`) the clock waits for the device at each entry and exit, so a forward's time
    is its kernels' and not only their launch."""

    def __init__(self, *models: torch.nn.Module, synchronize=None):
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0
        self._started = 0.0
        self._synchronize = synchronize
        self._handles = []
        for model in {id(m): m for m in models}.values():
            self._handles.append(model.register_forward_pre_hook(self._enter))
            self._handles.append(model.register_forward_hook(self._leave))

    def remove(self) -> None:
        """Stop timing: take the hooks off the models."""
        for handle in self._handles:
            handle.remove()

    def _enter(self, *_) -> None:
        if self._depth == 0:
            if self._synchronize is not None:
                self._synchronize()
            self._started = time.perf_counter()
            self.calls += 1
        self._depth += 1

    def _leave(self, *_) -> None:
        self._depth -= 1
        if self._depth == 0:
            if self._synchronize is not None:
                self._synchronize()
            self.seconds += time.perf_counter() - self._started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["image", "video"], default="image")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--fixture", action="store_true", help="the tiny fixture, its target as its own draft")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.fixture:
        target = tiny_qwen2_5_vl(seed=0)
        pair = SpeculativeVLM(target, target, compile="off")
        items = [chat_inputs(tiny_processor(), "Describe the image in detail.", images=[sample_image(0)])]
    else:
        pair = load_pair(torch_dtype=torch.float32, compile="off")
        items = suite_inputs(pair.processor, args.suite, args.n)
    clock = ForwardClock(pair.target, pair.draft)
    print(f"{'policy':<12} {'tokens':>6} {'steps':>5} {'tau':>5} {'wall s':>7} {'outside forwards':>17}")
    for policy in POLICIES:
        spec = pair.with_options(policy)
        spec.generate(**items[0], max_new_tokens=16, do_sample=False)
        clock.seconds, wall, tokens, steps, accepted = 0.0, 0.0, 0, 0, 0
        for inputs in items:
            start = time.perf_counter()
            spec.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
            wall += time.perf_counter() - start
            stats = spec.last_stats
            tokens, steps, accepted = (
                tokens + stats.new_tokens,
                steps + stats.iterations,
                accepted + sum(s.accepted for s in stats.steps),
            )
        share = 1.0 - clock.seconds / wall
        print(f"{policy:<12} {tokens:>6} {steps:>5} {accepted / max(1, steps):>5.2f} {wall:>7.3f} {share:>16.1%}")


if __name__ == "__main__":
    main()
