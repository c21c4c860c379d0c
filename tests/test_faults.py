"""Hard kills of a caption run at every moment of its life, one after another on the same output, each followed by
`--resume`: the output never keeps a torn line, no input is recorded twice or lost, and the run that finally finishes
leaves one record per input (in input order at batch size 1 and after a sharded run's merge), an error record for
each broken file, and nothing beside the output but its lock file.

Each kill is a real SIGKILL that the process sends itself (`tests/faults.py` installs it at the chosen moment), so
nothing of vlmspec's own runs after it: no `finally`, no handler, no buffered write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAMILIES, save_pair
from media_files import write_image, write_video

from vlmspec.captioning import read_records
from vlmspec.cli import EXIT_ERROR, main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
CLI = [sys.executable, "-m", "vlmspec.cli"]
#: The runner that kills its own process at a chosen moment (`python tests/faults.py <moment> <k> <vlmspec args>`).
FAULTS_SCRIPT = str(Path(__file__).with_name("faults.py"))
FAULTS = [sys.executable, FAULTS_SCRIPT]
#: Seconds any one run may take before the test stops it (and its whole process group).
TIMEOUT = 180

IMAGES, VIDEOS, BROKEN = "image", "video", "broken"
#: The inputs, in the order the runs take them: small images (i), a few short videos (v) and two corrupt "videos" (b).
#: Many, so that each killed run of two processes leaves inputs for the next: an input takes a few milliseconds, and
#: the process not killed goes on until the launcher stops it.
LAYOUT = [{"i": IMAGES, "v": VIDEOS, "b": BROKEN}[c] for c in "iiibiiiiiiviiiiiiiiiiviiiiiiiibiiiiiiviiiiii"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(FAMILIES["qwen2_5_vl"], tmp_path_factory.mktemp("pair"))


@pytest.fixture
def media(tmp_path) -> Path:
    """A folder of the `LAYOUT` inputs, named so that the folder's order is the layout's."""
    folder = tmp_path / "media"
    folder.mkdir()
    for i, kind in enumerate(LAYOUT):
        if kind == IMAGES:
            write_image(folder / f"{i:02d}_image.png", size=(32, 40), seed=i)
        elif kind == VIDEOS:
            write_video(folder / f"{i:02d}_video.mp4", num_frames=8, size=(32, 32))
        else:
            (folder / f"{i:02d}_broken.mp4").write_bytes(random.Random(i).randbytes(2500))
    return folder


@pytest.fixture
def out(tmp_path) -> Path:
    """The output, alone in its folder so that whatever a run leaves beside it shows."""
    (tmp_path / "out").mkdir()
    return tmp_path / "out" / "captions.jsonl"


def caption_args(pair, media: Path, out: Path, *extra: str) -> list[str]:
    model = ["--model", pair[0], "--draft", pair[1], "--max-new-tokens", "8", "--num-frames", "4"]
    return ["caption", str(media), "--out", str(out), *model, "--no-progress", *extra]


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run `command` to its end; past `TIMEOUT` its whole process group (a launcher and its workers) is killed."""
    process = subprocess.Popen(
        command,
        env={**ENV, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command)} ran past {TIMEOUT}s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch(*script: str) -> list[str]:
    """`accelerate launch` of two processes (CPU processes on a machine without an accelerator), on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    fixed = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [*accelerate, *fixed, "--main_process_port", str(port), *script]


def files_of(out: Path) -> list[Path]:
    """The output and the shards of a sharded run, those that exist."""
    return [f for f in [out, *sorted(out.parent.glob(f"{out.name}.part*"))] if f.exists()]


def complete_records(path: Path) -> list[dict]:
    """The records of the complete lines of `path` (those ending in a newline), every one of which must parse."""
    data = path.read_bytes()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except ValueError:
            pytest.fail(f"line {number} of {path.name} is complete but not a record: {line[:200]!r}")
    return [json.loads(line) for line in lines]


def torn(path: Path) -> bool:
    """Whether `path` ends in a line without its newline."""
    data = path.read_bytes()
    return bool(data) and not data.endswith(b"\n")


def recorded_once(out: Path, inputs: list[str]) -> list[str]:
    """The inputs recorded in the output and its shards, each at most once and each one of `inputs`."""
    paths = [r["path"] for f in files_of(out) for r in complete_records(f)]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    assert not twice, f"inputs recorded twice: {twice}"
    assert set(paths) <= set(inputs)
    return paths


def assert_finished(out: Path, media: Path, ordered: bool = True) -> None:
    """One record per input, in input order if `ordered` (else in the order inputs finished): an error record for each
    broken file, a caption for every other; and beside the output nothing but its lock file (no shard, no temporary
    file)."""
    inputs = sorted(str(p) for p in media.iterdir())
    records = complete_records(out)
    assert not torn(out)
    if not ordered:
        records = sorted(records, key=lambda r: r["path"])
    assert [r["path"] for r in records] == inputs
    for record, kind in zip(records, LAYOUT, strict=True):
        if kind == BROKEN:
            assert record["error_type"] == "UnreadableVideoError" and "caption" not in record
        else:
            assert "error" not in record and isinstance(record["caption"], str)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name, f"{out.name}.lock"]


def single_process_kills(batch_size: int) -> list[tuple[str, int]]:
    """The kills of a single-process run, in sequence: (moment, k); each run but the first resumes. Each run killed
    while generating or decoding has recorded inputs by then: the (batch size + 1)-th input reaches the model once
    one before it has finished, and `batch_size + 2` inputs are read ahead of those in flight (an input read and
    found broken takes no place in the batch)."""
    return [
        ("load", 1),
        ("mid-record", 3),
        ("resuming", 1),
        ("after-record", 3),
        ("generating", batch_size + 1),
        ("decoding", 2 * batch_size + 6),
    ]


@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_run_killed_at_every_moment_and_resumed_each_time_records_every_input_once(pair, media, out, batch_size):
    inputs = sorted(str(p) for p in media.iterdir())
    torn_before = None
    batch = ["--batch-size", str(batch_size)]
    for i, (moment, k) in enumerate(single_process_kills(batch_size)):
        before = out.read_bytes() if out.exists() else b""
        resume = ["--resume"] if i else []
        killed = run(FAULTS + [moment, str(k)] + caption_args(pair, media, out, *resume, *batch))
        assert killed.returncode == -signal.SIGKILL, f"{moment}: not killed\n{killed.stderr[-3000:]}"
        after = out.read_bytes() if out.exists() else b""
        written = recorded_once(out, inputs)
        assert not list(out.parent.glob(f"{out.name}.part*"))
        if moment in ("load", "resuming"):
            assert after == before, f"{moment}: the output changed before any record was due"
        else:
            assert len(written) > before.count(b"\n"), f"{moment}: the run recorded nothing"
        if torn_before is not None and moment != "resuming":
            # the first run past the resume preparation since the torn write: the torn tail is gone, the complete
            # records before it are kept byte for byte, and every line of the file is a record
            assert after.startswith(torn_before[: torn_before.rfind(b"\n") + 1])
            assert not torn(out) and len(complete_records(out)) == after.count(b"\n")
            torn_before = None
        if moment == "mid-record":
            assert torn(out), "the kill half way through a record left no torn line"
            torn_before = after
        if moment == "resuming":
            assert torn(out), "the resume preparation was killed before it could cut the torn line"
    assert torn_before is None
    assert 0 < len(written) < len(inputs), "the kills left nothing for the last run to do"
    final = run(CLI + caption_args(pair, media, out, "--resume", *batch))
    assert "done:" in final.stdout, final.stderr[-3000:]
    assert_finished(out, media, ordered=batch_size == 1)
    code = final.returncode
    assert code == EXIT_ERROR, f"exit {code}, though the output records errors for the broken files"


#: The kills of a run of two processes (each decoding `DEFAULT_CAPTION_BATCH_SIZE` inputs at once), in sequence:
#: (moment, k, the rank killed); each run but the first resumes.
SHARDED_KILLS = [
    ("load", 1, 1),
    ("mid-record", 2, 0),
    ("resuming", 2, 0),  # the output (absent) is the first file prepared, the torn shard .part0 the second
    ("after-record", 1, 1),
    ("generating", 1, 0),
    ("merging", 1, 0),
]


def test_a_sharded_run_killed_at_every_moment_and_resumed_each_time_merges_every_input_once(pair, media, out):
    """Killing one process makes the launcher stop the other one (SIGTERM) and exit 1; the shards it leaves are
    resumed, and the last run merges them."""
    inputs = sorted(str(p) for p in media.iterdir())
    tmp = out.with_name(f".{out.name}.tmp")
    torn_shards: dict[Path, bytes] = {}
    for i, (moment, k, rank) in enumerate(SHARDED_KILLS):
        before = {f: f.read_bytes() for f in files_of(out)}
        resume = ["--resume"] if i else []
        script = [FAULTS_SCRIPT, moment, str(k)] + caption_args(pair, media, out, *resume)
        killed = run(launch(*script), FAULT_RANK=str(rank))
        assert killed.returncode == 1 and "Signal 9 (SIGKILL) received" in killed.stderr, (
            f"{moment}: rank {rank} was not killed\n{killed.stdout}\n{killed.stderr[-3000:]}"
        )
        recorded_once(out, inputs)
        if moment == "resuming":
            assert {f: f.read_bytes() for f in files_of(out)} == before, "the killed resume preparation changed a file"
        else:
            for shard, data in torn_shards.items():
                # the resume preparation cut the torn tail; the complete records before it are kept byte for byte
                assert shard.read_bytes().startswith(data[: data.rfind(b"\n") + 1]) and not torn(shard)
            torn_shards = {}
        if moment == "mid-record":
            shard = out.with_name(f"{out.name}.part{rank}")
            assert torn(shard), "the kill half way through a record left no torn line"
            torn_shards = {shard: shard.read_bytes()}
        if moment == "merging":
            # killed between writing the merged file and putting it in place: the output is as it was, the shards
            # are all there, and the merged file waits beside them
            assert (out.read_bytes() if out.exists() else None) == before.get(out)
            assert sorted(recorded_once(out, inputs)) == inputs
            assert [r["path"] for r in complete_records(tmp)] == inputs
    final = run(launch("-m", "vlmspec.cli", *caption_args(pair, media, out, "--resume")))
    assert final.stdout.count("done:") == 2, final.stderr[-3000:]
    assert_finished(out, media)
    code = final.returncode
    assert code == EXIT_ERROR, f"exit {code}, though the output records errors for the broken files"


def test_the_resume_that_finishes_a_killed_run_exits_1_when_inputs_are_recorded_as_errors(pair, tmp_path, out, capsys):
    """Exit 0 says every input was captioned; a job whose broken file was recorded before the kill has not."""
    media = tmp_path / "media"
    media.mkdir()
    (media / "a_broken.mp4").write_bytes(random.Random(0).randbytes(2500))
    write_image(media / "b.png", seed=0)
    killed = run(FAULTS + ["after-record", "1"] + caption_args(pair, media, out))
    assert killed.returncode == -signal.SIGKILL
    assert [r["error_type"] for r in read_records(out)] == ["UnreadableVideoError"]
    try:
        main(caption_args(pair, media, out, "--resume"))
        code = 0
    except SystemExit as exited:
        code = exited.code
    assert "1 captioned, 0 errors, 1 already recorded; " in (summary := capsys.readouterr().out)
    assert "the output holds 1 error record (--resume --retry-errors retries them)" in summary
    assert [Path(r["path"]).name for r in read_records(out)] == ["a_broken.mp4", "b.png"]
    assert code == EXIT_ERROR, f"exit {code}: the output holds an error record, so not every input was captioned"
