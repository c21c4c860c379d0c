"""Batch captioning: the JSON-lines contract, bad files, resuming, hard kills and sharding under accelerate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAMILIES, save_pair
from media_files import write_image, write_video

from vlmspec.captioning import discover_inputs, read_records

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


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
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", *"--num_processes 2 --num_machines 1".split()]
ACCELERATE += [*"--mixed_precision no --dynamo_backend no --cpu -m vlmspec.cli".split()]


def caption_args(pair, inputs, out, *extra, max_new_tokens=12) -> list[str]:
    """`vlmspec caption` arguments for the saved tiny pair."""
    model = ["--model", pair[0], "--draft", pair[1], "--max-new-tokens", str(max_new_tokens)]
    return ["caption", *inputs, "--out", str(out), *model, "--num-frames", "4", "--no-progress", *extra]


def caption(pair, inputs, out, *extra, check=True):
    return subprocess.run(
        CLI + caption_args(pair, inputs, out, *extra), env=ENV, capture_output=True, text=True, check=check
    )


def test_inputs_are_files_folders_and_lists(collection):
    paths = discover_inputs(collection)
    names = [Path(p).name for p in paths]
    assert names == ["a.png", "c_broken.mp4", "b.mp4", "d.jpg", "extra.webp"]


def test_one_record_per_input_with_an_error_record_for_the_corrupt_file(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    result = caption(pair, collection, out)
    records = read_records(out)
    assert [Path(r["path"]).name for r in records] == ["a.png", "c_broken.mp4", "b.mp4", "d.jpg", "extra.webp"]
    broken = records[1]
    assert broken["error_type"] == "UnreadableVideoError" and "c_broken.mp4" in broken["error"]
    for record in records[:1] + records[2:]:
        assert set(record) == {"path", "caption", "new_tokens", "tau", "seconds"}
        assert 0 < record["new_tokens"] <= 12
    assert "4 captioned, 1 errors" in result.stdout


def test_resume_after_a_finished_run_does_nothing(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    caption(pair, collection, out)
    before = out.read_bytes()
    result = caption(pair, collection, out, "--resume")
    assert out.read_bytes() == before
    assert "0 captioned, 0 errors, 5 already recorded" in result.stdout


def test_an_existing_output_is_not_overwritten_without_resume(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    out.write_text('{"path": "keep"}\n')
    result = caption(pair, collection, out, check=False)
    assert result.returncode != 0 and "--resume" in result.stderr
    assert out.read_text() == '{"path": "keep"}\n'


def test_a_run_killed_midway_and_resumed_records_every_input_once(pair, tmp_path):
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
    with open(out, "a") as f:
        f.write('{"path": "torn')
    caption(pair, [str(folder)], out, "--resume")
    paths = [r["path"] for r in read_records(out)]
    assert sorted(paths) == sorted(str(p) for p in folder.iterdir())
    assert len(paths) == len(set(paths)) == 12


def test_two_processes_under_accelerate_shard_and_merge(pair, collection, tmp_path):
    out = tmp_path / "captions.jsonl"
    command = ACCELERATE + caption_args(pair, collection, out, max_new_tokens=8)
    subprocess.run(command, env=ENV, capture_output=True, text=True, check=True, timeout=300)
    records = read_records(out)
    assert [Path(r["path"]).name for r in records] == ["a.png", "c_broken.mp4", "b.mp4", "d.jpg", "extra.webp"]
    assert not list(tmp_path.glob("captions.jsonl.part*"))
