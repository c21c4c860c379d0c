"""Seconds to the first tokens of a fresh process: load the demo pair compiled and decode 2 tokens of the image
suite's first item at B rows. Run it twice with one `TORCHINDUCTOR_CACHE_DIR` (a new folder, then the folder the
first run filled) to see what a persisted compile cache saves.

    TORCHINDUCTOR_CACHE_DIR=/tmp/cache python scripts/first_token_seconds.py --rows 8
"""

from __future__ import annotations

import argparse
import time

STARTED = time.perf_counter()

from torch._dynamo.utils import counters  # noqa: E402

from vlmspec.api import load_pair  # noqa: E402
from vlmspec.eval.bench import suite_inputs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1, help="copies of the prompt decoded together (default 1)")
    args = parser.parse_args()
    spec = load_pair(None, None, compile="on")
    inputs = suite_inputs(spec.processor, "image", 1)[0]
    loaded = time.perf_counter()
    if args.rows == 1:
        spec.generate(**inputs, max_new_tokens=2)
    else:
        list(spec.stream(((b, inputs) for b in range(args.rows)), args.rows, max_new_tokens=2))
    done = time.perf_counter()
    graphs = counters["stats"]["unique_graphs"]
    print(
        f"B={args.rows}: import and load {loaded - STARTED:.1f} s, first call {done - loaded:.1f} s, "
        f"total {done - STARTED:.1f} s, {graphs} graphs compiled"
    )


if __name__ == "__main__":
    main()
