"""Run `vlmspec` with one fault: at a chosen moment the process kills itself with SIGKILL, as the OOM killer, a
preempted job or a power cut would, with no chance to clean up.

    python tests/faults.py <moment> <k> <vlmspec arguments...>

`k` picks the k-th occurrence of the moment in this process (1: the first). Under a distributed launch (`accelerate
launch`, `torchrun`) the fault is installed only on the process whose `RANK` is `FAULT_RANK` (default 0); the others
run unchanged, until the launcher stops them when it sees the killed one gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable

import vlmspec.api
from vlmspec import captioning
from vlmspec.cli import main
from vlmspec.engine.prefill import Prefiller


def die() -> None:
    """SIGKILL this process: no handler, no `finally`, no flush of buffers beyond what is already on disk."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Countdown:
    """True at the k-th call, False at the others."""

    def __init__(self, k: int):
        self.k = k
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls == self.k


def at_load(k: int) -> None:
    """Right after the model pair is loaded (the k-th load of this process), before any record is written."""
    load_pair, now = vlmspec.api.load_pair, Countdown(k)

    def loaded_then_die(*args, **kwargs):
        pair = load_pair(*args, **kwargs)
        if now():
            die()
        return pair

    vlmspec.api.load_pair = loaded_then_die


def mid_record(k: int) -> None:
    """Half way through writing the k-th record: the first half of its line's bytes reach the disk (flushed and
    synced), the rest never does, leaving a torn last line without its newline."""
    write, now = captioning.RecordWriter.write, Countdown(k)

    def torn_write(self, record):
        if now():
            line = json.dumps(record, ensure_ascii=False) + "\n"
            self.file.write(line[: len(line) // 2])
            self.file.flush()
            os.fsync(self.file.fileno())
            die()
        write(self, record)

    captioning.RecordWriter.write = torn_write


def after_record(k: int) -> None:
    """Right after the k-th record is written whole, flushed and synced."""
    write, now = captioning.RecordWriter.write, Countdown(k)

    def write_then_die(self, record):
        write(self, record)
        if now():
            die()

    captioning.RecordWriter.write = write_then_die


def generating(k: int) -> None:
    """While the k-th input to reach the model decodes: at the target's second forward pass from the prefill that
    takes it in on (its first verification, a decoding step it takes part in, or another prefill after it); the input
    is never recorded. Inputs reach the model through `Prefiller.admit` (the inputs joining a batch, one or
    many, prefilled together or one by one)."""
    admit_all = Prefiller.admit
    seen = [0]

    def arm(model) -> None:
        passes = Countdown(2)
        model.get_input_embeddings().register_forward_pre_hook(lambda module, inputs: die() if passes() else None)

    def admit_all_and_die(self, requests):
        first = seen[0] + 1
        seen[0] += len(requests)
        if first <= k <= seen[0]:
            arm(self.target.adapter.model)
        return admit_all(self, requests)

    Prefiller.admit = admit_all_and_die


def decoding(k: int) -> None:
    """As the k-th input starts decoding: on a thread that reads media ahead, while the inputs before it generate."""
    load, now = captioning.load_input, Countdown(k)

    def load_or_die(*args, **kwargs):
        if now():
            die()
        return load(*args, **kwargs)

    captioning.load_input = load_or_die


class _OsDyingAtReplace:
    """`os` as the captioning module sees it, except that its k-th `replace` kills the process instead."""

    def __init__(self, k: int):
        self.now = Countdown(k)

    def __getattr__(self, name: str):
        return getattr(os, name)

    def replace(self, src, dst) -> None:
        if self.now():
            die()
        os.replace(src, dst)


def merging(k: int) -> None:
    """During the k-th atomic rewrite (the shard merge of a sharded run): the merged temporary file is written and
    synced, the `os.replace` that would put it in place never happens (the output and the shards stay as they were)."""
    assert captioning.os is os, "vlmspec.captioning no longer reaches os.replace through `os`"
    captioning.os = _OsDyingAtReplace(k)


def resuming(k: int) -> None:
    """During the resume preparation, as the k-th file (the output, then each shard) is about to lose its torn last
    line: that line and the files after it stay as they were."""
    cut, now = captioning.cut_torn_line, Countdown(k)

    def cut_or_die(path):
        if now():
            die()
        cut(path)

    captioning.cut_torn_line = cut_or_die


#: The moments a fault can kill the run at, by name.
MOMENTS: dict[str, Callable[[int], None]] = {
    "load": at_load,
    "mid-record": mid_record,
    "after-record": after_record,
    "generating": generating,
    "decoding": decoding,
    "merging": merging,
    "resuming": resuming,
}


def run(argv: list[str]) -> None:
    moment, k, *vlmspec_args = argv
    if os.environ.get("RANK", "0") == os.environ.get("FAULT_RANK", "0"):
        MOMENTS[moment](int(k))
    main(vlmspec_args)


if __name__ == "__main__":
    run(sys.argv[1:])
