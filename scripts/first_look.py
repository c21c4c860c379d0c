"""The decisive GPU figures in at most eight minutes, most valuable first (`scripts/gpu_report.sh OUTDIR first-look`).

A lent GPU machine gives 15 minutes in all, its start included, so this runs, in order, each sub-step time-boxed (a
sub-step's unused seconds pass to the next; none starts once the budget is spent):

  environment            the GPU, its driver, torch, transformers, what was carried and the size of what travelled
  demo-eager             the demo pair, 8 image items, 128 new tokens: plain `generate`, `ar-compiled` (static cache
                         + torch.compile) and vlmspec's default (`auto`), eager; exact match and tokens/s
  demo-compiled          the same default with `compile="auto"` (CUDA graphs on CUDA) beside `generate`: whether the
                         compiled path ran or fell back, and why
  costs-llava_onevision  step costs of LLaVA-OneVision-7B + 0.5B at the released sizes (random weights, bf16),
                         compiled: `generate` ms a token, verification of 1-64 nodes, a draft level, vlmspec's own ms a
                         step, the projection at the SAGE paper's acceptance lengths and the own ms that breaks even
  profile                `vlmspec profile` at B=1 and B=16: launches and host reads a step
  exactness              the exactness test files on the device, stopping at the first failure
  costs-qwen2_5_vl       as costs-llava_onevision, for Qwen2.5-VL-7B + 3B, with a draft head in the released
                         shape beside the 3B draft (its level ms at each context, then its own ms a step), with what
                         time is left

Everything is gathered into three files in OUTDIR, rewritten as each sub-step ends, so a run cut off returns what it
measured (a lent machine sends back at most 8 files): `first-look.md` (the tables), `first-look.json` (every
record and number) and `first-look.log` (each sub-step's output). A sub-step that fails or runs out of time is
recorded and the next goes on; the run exits 1 if any did not pass.

`--device cpu --quick` runs every sub-step at its smallest settings (one item, a few tokens, the replicas' tiny sizes,
one exactness case), to check that all of them run: its numbers are no figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from first_look_steps import BUDGET, STEPS, Settings, SubStep, run_sub_step

ROOT = Path(__file__).resolve().parents[1]
QUICK_BUDGET = 180.0
FILES = ("first-look.md", "first-look.json", "first-look.log")


@dataclass
class Report:
    """What the run has gathered so far, written out whole after every sub-step."""

    out: Path
    settings: Settings
    records: list[dict]
    started: float

    def write(self) -> None:
        seconds = round(time.monotonic() - self.started, 1)
        document = {
            "device": self.settings.device,
            "quick": self.settings.quick,
            "budget_seconds": self.settings.budget,
        }
        document |= {"total_seconds": seconds, "sub_steps": self.records}
        (self.out / "first-look.json").write_text(json.dumps(document, indent=1, default=str))
        (self.out / "first-look.md").write_text(self.markdown(seconds))

    def markdown(self, seconds: float) -> str:
        mode = ", quick settings (checks that every sub-step runs; no figures)" if self.settings.quick else ""
        lines = [
            f"# First look on {self.settings.device}{mode}",
            "",
            f"{seconds:.0f} s of a {self.settings.budget:.0f} s budget.",
            "",
        ]
        lines += ["| sub-step | status | seconds | limit |", "| --- | --- | --- | --- |"]
        for record in self.records:
            lines.append(f"| {record['name']} | {record['status']} | {record['seconds']:.0f} | {record['limit']:.0f} |")
        for record in self.records:
            lines += ["", f"## {record['name']}: {record['status']}", "", record["what"], "", f"`{record['command']}`"]
            if record["markdown"]:
                lines += ["", demoted(record["markdown"].strip())]
        return "\n".join(lines) + "\n"

    def append_log(self, record: dict, text: str) -> None:
        with open(self.out / "first-look.log", "a") as log:
            log.write(f"===== {record['name']}: {record['status']} in {record['seconds']} s: {record['command']}\n")
            log.write(text.rstrip() + "\n")


def demoted(markdown: str) -> str:
    """`markdown` with its headings two levels down, to sit under a sub-step's own heading."""
    return re.sub(r"^(#+) ", lambda m: "#" * min(6, len(m.group(1)) + 2) + " ", markdown, flags=re.MULTILINE)


def run(settings: Settings, out: Path, steps: list[SubStep], clock: Callable[[], float] = time.monotonic) -> list[dict]:
    """Every sub-step in order within the budget; each one's limit is its own seconds plus what those before it left
    unused (the last takes all that is left), and never past the budget. Returns the records, written to `out` as each
    ends."""
    report = Report(out, settings, [], clock())
    (out / "first-look.log").write_text("")
    deadline = report.started + settings.budget
    banked = 0.0
    for index, step in enumerate(steps):
        left = deadline - clock()
        own = left if step.seconds is None or index == len(steps) - 1 else step.seconds + banked
        limit = max(0.0, min(own, left))
        record, log = run_sub_step(step, settings, limit)
        if step.seconds is not None:
            banked = max(0.0, limit - record["seconds"])
        report.records.append(record)
        report.append_log(record, log)
        report.write()
        print(f"first_look: {record['name']}: {record['status']} in {record['seconds']} s", flush=True)
    return report.records


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", help="the folder first-look.md, .json and .log are written into (made if missing)")
    parser.add_argument("--device", default="cuda", help="where everything runs (default cuda)")
    parser.add_argument("--quick", action="store_true", help="smallest settings: checks that every sub-step runs")
    parser.add_argument(
        "--budget", type=float, help=f"wall seconds in all (default {BUDGET:.0f}; {QUICK_BUDGET:.0f} with --quick)"
    )
    parser.add_argument(
        "--work", type=Path, help="where sub-steps write their own files (default: a new temporary folder)"
    )
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be above 0, got {args.budget}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="vlmspec-first-look-"))
    budget = args.budget or (QUICK_BUDGET if args.quick else BUDGET)
    settings = Settings(work=work.resolve(), device=args.device, quick=args.quick, budget=budget)
    records = run(settings, out, STEPS)
    failed = [r["name"] for r in records if r["status"] != "ok"]
    print(f"first_look: {len(records) - len(failed)} of {len(records)} sub-steps ok; {out / 'first-look.md'}")
    if failed:
        print(f"first_look: not ok: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
