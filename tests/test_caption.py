"""Batch captioning: the JSON-lines contract, input errors recorded, model errors stopping the job, resuming and
retrying, hard kills and sharding under accelerate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, FAMILIES, device_flags, device_map, save_pair
from media_files import write_image, write_video

from vlmspec import SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.captioning import CaptioningStopped, CaptionSettings, discover_inputs, read_records, run_captioning
from vlmspec.cli import EXIT_CONFIGURATION, EXIT_ERROR, main
from vlmspec.output_lock import OutputLock

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
if DEVICE.type == "cpu":
    ENV["CUDA_VISIBLE_DEVICES"] = ""
NAMES = ["a.png", "c_broken.mp4", "b.mp4", "d.jpg", "extra.webp"]
SETTINGS = CaptionSettings(num_frames=4, max_new_tokens=8)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(FAMILIES["qwen2_5_vl"], tmp_path_factory.mktemp("pair"))


@pytest.fixture
def collection(tmp_path):
    """A folder of two images, a video and a corrupt video in the middle, plus a list file naming one more image."""
    media = tmp_path / "media"
    (media / "clips").mkdir(parents=True)
    write_image(media / "a.png", seed=1)
    write_video(media / "clips" / "b.mp4", num_frames=12, size=(64, 64))
    (media / "c_broken.mp4").write_bytes(os.urandom(3000))
    write_image(media / "d.jpg", seed=2)
    extra = write_image(tmp_path / "extra.webp", seed=3)
    listing = tmp_path / "more.txt"
    listing.write_text(f"# one more\n{extra}\n")
    return [str(media), str(listing)]


CLI = [sys.executable, "-m", "vlmspec.cli"]
#: Two CPU processes whose accelerate state is distributed (`accelerate launch --cpu` would start only one).
SHARDED = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "vlmspec.cli"]


def caption_args(pair, inputs, out, *extra, max_new_tokens=12, sharded=False) -> list[str]:
    """`vlmspec caption` arguments for the saved tiny pair, on the test device unless the launcher places it."""
    model = ["--model", pair[0], "--draft", pair[1], "--max-new-tokens", str(max_new_tokens)]
    if not sharded:
        model += device_flags()
    return ["caption", *inputs, "--out", str(out), *model, "--num-frames", "4", "--no-progress", *extra]


def caption(capsys, pair, inputs, out, *extra, max_new_tokens=12) -> tuple[int, str, str]:
    """Run `vlmspec caption` in this process: its exit code, what it printed and what it reported on stderr."""
    try:
        main(caption_args(pair, inputs, out, *extra, max_new_tokens=max_new_tokens))
        code = 0
    except SystemExit as exited:
        code = exited.code
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def lines(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


class OutOfMemoryOnVideos(SpeculativeVLM):
    """The real pair, except that generating for a video runs out of memory, as a long video can on a GPU."""

    def generate(self, input_ids=None, generation_config=None, streamer=None, **kwargs):
        if kwargs.get("pixel_values_videos") is not None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return super().generate(input_ids, generation_config, streamer, **kwargs)


def test_inputs_are_files_folders_and_lists(collection):
    paths = discover_inputs(collection)
    assert [Path(p).name for p in paths] == NAMES


def test_one_record_per_input_with_an_error_record_for_the_corrupt_file(pair, collection, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    code, printed, _ = caption(capsys, pair, collection, out)
    records = read_records(out)
    assert code == EXIT_ERROR and [Path(r["path"]).name for r in records] == NAMES
    broken = records[1]
    assert broken["error_type"] == "UnreadableVideoError" and "c_broken.mp4" in broken["error"]
    for record in records[:1] + records[2:]:
        assert set(record) == {"path", "caption", "new_tokens", "tau", "seconds"}
        assert 0 < record["new_tokens"] <= 12
    assert "4 captioned, 1 errors" in printed


def test_a_file_the_processor_rejects_is_recorded_and_the_run_carries_on(pair, tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    write_image(folder / "a_thin.png", size=(2, 500))
    write_image(folder / "b.png", seed=1)
    out = tmp_path / "captions.jsonl"
    spec = load_pair(*pair, device_map=device_map())
    run_captioning(lambda state: spec, [str(folder)], out, SETTINGS, progress=False)
    thin, fine = read_records(out)
    assert thin["error_type"] == "MediaRejectedError" and "aspect ratio" in thin["error"]
    assert thin["path"] in thin["error"]
    assert Path(fine["path"]).name == "b.png" and fine["new_tokens"] > 0


def test_a_model_error_stops_the_job_keeping_the_records_and_a_resume_retries_that_input(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    spec = load_pair(*pair, device_map=device_map())
    failing = OutOfMemoryOnVideos(spec.target, spec.draft, vocab_size=spec.vocab_size, processor=spec.processor)
    with pytest.raises(CaptioningStopped) as stopped:
        run_captioning(lambda state: failing, collection, out, SETTINGS, progress=False)
    assert Path(stopped.value.path).name == "b.mp4" and not stopped.value.configuration
    assert isinstance(stopped.value.error, torch.OutOfMemoryError)
    assert [Path(r["path"]).name for r in read_records(out)] == ["a.png", "c_broken.mp4"]
    summary = run_captioning(lambda state: spec, collection, out, SETTINGS, resume=True, progress=False)
    assert [Path(r["path"]).name for r in read_records(out)] == NAMES
    assert (summary.captioned, summary.errors, summary.skipped) == (3, 0, 2)


def test_a_run_with_no_failed_input_exits_0(pair, tmp_path, capsys):
    folder = tmp_path / "clean"
    folder.mkdir()
    write_image(folder / "a.png", seed=0)
    code, printed, _ = caption(capsys, pair, [str(folder)], tmp_path / "captions.jsonl")
    assert code == 0 and "1 captioned, 0 errors" in printed


def test_resume_after_a_finished_run_does_nothing(pair, collection, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    caption(capsys, pair, collection, out)
    before = out.read_bytes()
    _, printed, _ = caption(capsys, pair, collection, out, "--resume")
    assert out.read_bytes() == before
    assert "0 captioned, 0 errors, 5 already recorded" in printed


def test_retry_errors_recaptions_recorded_failures_and_keeps_one_record_per_input(pair, collection, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    caption(capsys, pair, collection, out, max_new_tokens=8)
    before = out.read_text().splitlines(keepends=True)
    broken = Path(collection[0]) / "c_broken.mp4"
    write_video(broken, num_frames=12, size=(64, 64))
    _, printed, _ = caption(capsys, pair, collection, out, "--resume", "--retry-errors", max_new_tokens=8)
    after = out.read_text().splitlines(keepends=True)
    assert after[:4] == [line for line in before if "error" not in json.loads(line)]
    assert json.loads(after[4])["path"] == str(broken) and json.loads(after[4])["new_tokens"] > 0
    assert sorted(Path(r["path"]).name for r in read_records(out)) == sorted(NAMES)
    assert "1 captioned, 0 errors, 4 already recorded (1 recorded errors retried)" in printed


def test_retry_errors_retries_failures_in_the_shards_of_a_sharded_run_and_merges_them(pair, tmp_path, capsys):
    folder = tmp_path / "media"
    folder.mkdir()
    paths = [str(write_image(folder / f"{name}.png", seed=i)) for i, name in enumerate("abcd")]
    caption_record = {"caption": "kept", "new_tokens": 3, "tau": 1.0, "seconds": 0.1}
    error_record = {"error": "out of disk space", "error_type": "OSError"}
    out = tmp_path / "captions.jsonl"
    shard = tmp_path / "captions.jsonl.part1"
    out.write_text(lines({"path": paths[0], **caption_record}, {"path": paths[1], **error_record}))
    shard.write_text(lines({"path": paths[2], **error_record}, {"path": paths[3], **caption_record}))
    caption(capsys, pair, [str(folder)], out, "--resume", "--retry-errors", max_new_tokens=8)
    records = read_records(out)
    assert [r["path"] for r in records] == paths
    assert records[0] == {"path": paths[0], **caption_record} and records[3] == {"path": paths[3], **caption_record}
    assert records[1]["new_tokens"] > 0 and records[2]["new_tokens"] > 0
    assert not shard.exists()


def test_an_existing_output_is_not_overwritten_without_resume(pair, collection, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    out.write_text('{"path": "keep"}\n')
    code, _, err = caption(capsys, pair, collection, out)
    assert code == EXIT_CONFIGURATION and "--resume" in err
    assert out.read_text() == '{"path": "keep"}\n'


def test_a_run_killed_midway_and_resumed_records_every_input_once(pair, tmp_path, capsys):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(12):
        write_image(folder / f"img{i:02d}.png", seed=i)
    out = tmp_path / "captions.jsonl"
    command = CLI + caption_args(pair, [str(folder)], out, max_new_tokens=48)
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_records(out)) < 2:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = len(read_records(out))
    assert 2 <= written < 12
    assert OutputLock(out).path.exists()  # the killed run's lock file stays; its lock went with the process
    with open(out, "a") as f:
        f.write('{"path": "torn')
    caption(capsys, pair, [str(folder)], out, "--resume")
    paths = [r["path"] for r in read_records(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir())
    assert len(paths) == len(set(paths)) == 12


def test_sources_with_no_media_are_a_configuration_error_naming_where_and_what_was_searched(pair, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("not media")
    (tmp_path / "list.txt").write_text("# nothing listed\n")
    out = tmp_path / "captions.jsonl"
    code, _, err = caption(capsys, pair, [str(tmp_path / "empty"), str(tmp_path / "list.txt")], out)
    assert code == EXIT_CONFIGURATION
    assert "NoInputsError" in err and str(tmp_path / "empty") in err and "list.txt" in err and ".mp4" in err
    assert not out.exists()


def test_an_output_lock_has_one_holder_at_a_time(tmp_path):
    first, second = OutputLock(tmp_path / "c.jsonl"), OutputLock(tmp_path / "c.jsonl")
    assert first.acquire()
    assert not second.acquire()
    assert second.holder() == str(os.getpid())
    first.release()
    assert second.acquire()
    second.release()


def test_a_second_run_on_the_same_output_fails_at_once_and_the_first_finishes(pair, tmp_path):
    """The first run's first input is a pipe: it holds the run (and the lock) until the test writes an image into
    it, so the second run starts while the first is surely under way."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(20):
        write_image(folder / f"img{i:02d}.png", seed=i, size=(32, 32))
    pipe = tmp_path / "arriving.png"
    os.mkfifo(pipe)
    out = tmp_path / "captions.jsonl"
    first = subprocess.Popen(
        CLI + caption_args(pair, [str(pipe), str(folder)], out),
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and OutputLock(out).holder() != str(first.pid):
        time.sleep(0.05)
    assert first.poll() is None and OutputLock(out).holder() == str(first.pid)
    for extra in ([], ["--resume"]):
        second = subprocess.run(
            CLI + caption_args(pair, [str(folder)], out, *extra), env=ENV, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == EXIT_CONFIGURATION
        assert f"{out} is being written by another caption run (pid {first.pid})" in second.stderr
    assert first.poll() is None and read_records(out) == []
    pipe.write_bytes(write_image(tmp_path / "image.png", seed=99).read_bytes())
    assert first.wait(timeout=300) == 0
    paths = [r["path"] for r in read_records(out)]
    assert sorted(paths) == sorted([str(pipe), *(str(p) for p in folder.iterdir())])
    assert len(paths) == len(set(paths)) == 21


def test_two_processes_under_accelerate_shard_and_merge(pair, collection, tmp_path):
    """Both processes exit 1 (the corrupt video is an error of the run, whichever shard recorded it), after the
    merge."""
    out = tmp_path / "captions.jsonl"
    command = SHARDED + caption_args(pair, collection, out, max_new_tokens=8, sharded=True)
    env = {**ENV, "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == EXIT_ERROR, result.stderr
    assert result.stdout.count("done:") == 2
    assert [Path(r["path"]).name for r in read_records(out)] == NAMES
    assert not list(tmp_path.glob("captions.jsonl.part*"))


def test_a_locked_output_stops_every_process_of_a_sharded_run(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    lock = OutputLock(out)
    assert lock.acquire()
    try:
        command = SHARDED + caption_args(pair, collection, out, max_new_tokens=8, sharded=True)
        env = {**ENV, "ACCELERATE_USE_CPU": "1"}
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        lock.release()
    assert result.returncode != 0
    assert result.stderr.count("is being written by another caption run") == 2
    assert not out.exists() and not list(tmp_path.glob("captions.jsonl.part*"))
