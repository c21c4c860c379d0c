"""Record `transformers`' own video processors on the cases of `tests/video_cases.py` into tests/data/.

Needs torchvision (the processors' video slot): `make test-torchvision` builds `.venv-torchvision`, then run
`.venv-torchvision/bin/python scripts/record_video_processors.py`.
The recording keeps grids, seconds per grid, the prompt with runs of a token folded, a hash of the input ids and pixel
statistics, so the packers used without torchvision are checked against it everywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torchvision
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from video_cases import CASES, CONFIGS, RECORDINGS, real_processor, run, summary  # noqa: E402


def main() -> None:
    processors = {family: real_processor(family, config) for family, config in CONFIGS.items()}
    cases = []
    for case in CASES:
        inputs = run(processors[case.family], case)
        record = {"name": case.name, **case.__dict__, "config": CONFIGS[case.family]}
        record.update(summary(inputs, processors[case.family].tokenizer))
        cases.append(record)
        print(f"{case.name}: {record.get('video_grid_thw', record['pixels']['shape'])}", flush=True)
    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }
    RECORDINGS.parent.mkdir(exist_ok=True)
    RECORDINGS.write_text(json.dumps({"versions": versions, "cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {RECORDINGS} ({RECORDINGS.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
