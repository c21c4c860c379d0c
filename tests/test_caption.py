"""Batch captioning: the JSON-lines contract, input errors recorded, model errors stopping the job, resuming and
retrying, hard kills and sharding under accelerate, and inputs decoded together (the same captions at any batch
size)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, FAMILIES, device_flags, device_map, save_pair
from media_files import write_image, write_video

from vlmspec import captioning
from vlmspec.api import load_pair
from vlmspec.captioning import (
    DEFAULT_CAPTION_BATCH_SIZE,
    DEFAULT_PROMPTS,
    CaptioningStopped,
    CaptionSettings,
    discover_inputs,
    read_records,
    run_captioning,
)
from vlmspec.cli import CAPTION_BATCH_SIZE, EXIT_CONFIGURATION, EXIT_ERROR, build_parser, main
from vlmspec.engine.budget import KVBudget
from vlmspec.errors import InvalidArgumentError
from vlmspec.output_lock import OutputLock
from vlmspec.processors import load_image, load_video

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
    (media / "c_broken.mp4").write_bytes(random.Random(0).randbytes(3000))
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


def by_name(records: list[dict]) -> dict[str, dict]:
    """Records by their input's file name (inputs decoded together finish, and are recorded, in any order)."""
    return {Path(r["path"]).name: r for r in records}


@contextmanager
def out_of_memory_on_videos(spec):
    """The real pair, except that the target's forward over a video runs out of memory, as a long video can on a GPU."""

    def refuse(module, args, kwargs):
        if kwargs.get("pixel_values_videos") is not None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    hook = spec.target.register_forward_pre_hook(refuse, with_kwargs=True)
    try:
        yield spec
    finally:
        hook.remove()


def test_inputs_are_files_folders_and_lists(collection):
    paths = discover_inputs(collection)
    assert [Path(p).name for p in paths] == NAMES


def test_one_record_per_input_with_an_error_record_for_the_corrupt_file(pair, collection, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    code, printed, _ = caption(capsys, pair, collection, out)
    records = by_name(read_records(out))
    assert code == EXIT_ERROR and len(read_records(out)) == len(records) and sorted(records) == sorted(NAMES)
    broken = records.pop("c_broken.mp4")
    assert broken["error_type"] == "UnreadableVideoError" and "c_broken.mp4" in broken["error"]
    for record in records.values():
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
    thin, fine = sorted(read_records(out), key=lambda r: r["path"])
    assert thin["error_type"] == "MediaRejectedError" and "aspect ratio" in thin["error"]
    assert thin["path"] in thin["error"]
    assert Path(fine["path"]).name == "b.png" and fine["new_tokens"] > 0


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_model_error_stops_the_job_keeping_the_records_and_a_resume_retries_that_input(
    pair, collection, tmp_path, batch_size
):
    """At batch size 1 the inputs before the video are recorded; at 4 the inputs admitted with it (the image before
    it among them) are left unrecorded with it, and the resume captions them all."""
    out = tmp_path / "captions.jsonl"
    spec = load_pair(*pair, device_map=device_map())
    settings = replace(SETTINGS, batch_size=batch_size)
    with out_of_memory_on_videos(spec), pytest.raises(CaptioningStopped) as stopped:
        run_captioning(lambda state: spec, collection, out, settings, progress=False)
    assert Path(stopped.value.path).name == "b.mp4" and not stopped.value.configuration
    assert isinstance(stopped.value.error, torch.OutOfMemoryError)
    unrecorded = [Path(p).name for p in stopped.value.unrecorded]
    assert unrecorded[0] == "b.mp4"
    assert unrecorded == ["b.mp4"] if batch_size == 1 else "a.png" in unrecorded
    recorded = ["a.png", "c_broken.mp4"] if batch_size == 1 else ["c_broken.mp4"]
    assert [Path(r["path"]).name for r in read_records(out)] == recorded
    summary = run_captioning(lambda state: spec, collection, out, settings, resume=True, progress=False)
    assert sorted(Path(r["path"]).name for r in read_records(out)) == sorted(NAMES)
    assert (summary.captioned, summary.errors, summary.skipped) == (5 - len(recorded), 0, len(recorded))


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
    # One input at a time, so that the kill lands between records however fast the machine decodes.
    command = CLI + caption_args(pair, [str(folder)], out, "--batch-size", "1", max_new_tokens=48)
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


def greedy_captions(spec, out: Path, paths: list[str], batch_size: int, **settings) -> dict[str, str]:
    """Captions of `paths` by path, at `batch_size`."""
    settings = CaptionSettings(num_frames=4, max_new_tokens=10, batch_size=batch_size, **settings)
    run_captioning(lambda state: spec, paths, out, settings, progress=False)
    records = read_records(out)
    assert len(records) == len(paths) and all("caption" in r for r in records)
    return {r["path"]: r["caption"] for r in records}


@pytest.fixture
def mixed(tmp_path) -> list[str]:
    """Images of different sizes (prompts of different lengths) and two videos."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    sizes = [(60, 80), (32, 32), (96, 64), (48, 48), (64, 112)]
    paths = [str(write_image(folder / f"img{i}.png", size=size, seed=i)) for i, size in enumerate(sizes)]
    paths += [str(write_video(folder / f"clip{i}.mp4", num_frames=8 + 4 * i, size=(48, 64))) for i in range(2)]
    return paths


def test_captions_at_batch_size_4_are_those_at_batch_size_1_and_the_targets_own(pair, mixed, tmp_path):
    spec = load_pair(*pair, device_map=device_map())
    greedy = {"generation": {"do_sample": False}}
    alone = greedy_captions(spec, tmp_path / "one.jsonl", mixed, 1, **greedy)
    together = greedy_captions(spec, tmp_path / "four.jsonl", mixed, 4, **greedy)
    assert together == alone
    processor = spec.processor
    for path in mixed:
        image = path.endswith(".png")
        media = ([load_image(path)], []) if image else ([], [load_video(path, num_frames=4)])
        prompt = DEFAULT_PROMPTS["image" if image else "video"]
        inputs = {k: v.to(DEVICE) for k, v in processor.prompt_inputs(prompt, *media, [path]).items()}
        ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=10)
        length = inputs["input_ids"].shape[1]
        assert alone[path] == processor.tokenizer.decode(ids[0, length:], skip_special_tokens=True), path


def test_seeded_sampling_with_one_policy_writes_the_same_captions_at_batch_size_4_as_at_1(pair, mixed, tmp_path):
    spec = load_pair(*pair, device_map=device_map()).with_options("sage")
    sampled = {"generation": {"do_sample": True, "temperature": 1.5}, "seed": 7}
    alone = greedy_captions(spec, tmp_path / "one.jsonl", mixed, 1, **sampled)
    assert greedy_captions(spec, tmp_path / "four.jsonl", mixed, 4, **sampled) == alone
    assert alone != greedy_captions(spec, tmp_path / "greedy.jsonl", mixed, 1, generation={"do_sample": False})


def test_seeded_sampling_by_default_writes_the_same_captions_at_every_batch_size_above_1(pair, mixed, tmp_path):
    spec = load_pair(*pair, device_map=device_map())
    sampled = {"generation": {"do_sample": True, "temperature": 1.5}, "seed": 7}
    two = greedy_captions(spec, tmp_path / "two.jsonl", mixed, 2, **sampled)
    assert greedy_captions(spec, tmp_path / "four.jsonl", mixed, 4, **sampled) == two


def test_every_input_is_recorded_once_at_batch_size_3_among_good_and_bad_inputs(pair, collection, tmp_path, capsys):
    """The collection, plus a missing file and an image the processor refuses, listed among the good ones."""
    thin = write_image(tmp_path / "thin.png", size=(2, 500))
    more = [str(write_image(tmp_path / f"more{i}.png", seed=10 + i)) for i in range(3)]
    listing = tmp_path / "others.txt"
    listing.write_text("\n".join([more[0], str(tmp_path / "missing.png"), more[1], str(thin), more[2]]) + "\n")
    out = tmp_path / "captions.jsonl"
    code, printed, _ = caption(capsys, pair, [*collection, str(listing)], out, "--batch-size", "3", max_new_tokens=8)
    records = read_records(out)
    paths = [r["path"] for r in records]
    assert len(paths) == len(set(paths)) == 10 and set(paths) == set(discover_inputs([*collection, str(listing)]))
    errors = {Path(r["path"]).name: r["error_type"] for r in records if "error" in r}
    assert errors == {
        "c_broken.mp4": "UnreadableVideoError",
        "missing.png": "MediaNotFoundError",
        "thin.png": "MediaRejectedError",
    }
    assert code == EXIT_ERROR and "7 captioned, 3 errors" in printed


def test_an_input_too_large_for_the_memory_budget_is_recorded_and_the_job_goes_on(pair, tmp_path, capsys):
    """The budget holds a small image's KV cache but not a long video's."""
    folder = tmp_path / "media"
    folder.mkdir()
    write_image(folder / "a.png", size=(32, 32), seed=0)
    write_video(folder / "b_long.mp4", num_frames=24, size=(96, 128))
    write_image(folder / "c.png", size=(32, 32), seed=1)
    spec = load_pair(*pair, device_map=device_map())
    image = spec.processor.prompt_inputs(DEFAULT_PROMPTS["image"], [load_image(folder / "a.png")], [])
    budget = KVBudget(1.0, spec.target, spec.draft)
    gigabytes = 1.5 * budget.need(image["input_ids"].shape[1] + 8) / 1e9
    out = tmp_path / "captions.jsonl"
    code, printed, _ = caption(
        capsys, pair, [str(folder)], out, "--kv-budget-gb", f"{gigabytes:.9f}", "--num-frames", "16", max_new_tokens=8
    )
    records = by_name(read_records(out))
    assert sorted(records) == ["a.png", "b_long.mp4", "c.png"]
    video = records["b_long.mp4"]
    assert video["error_type"] == "MemoryBudgetError" and "--kv-budget-gb" in video["error"]
    assert video["path"] in video["error"]
    assert records["a.png"]["new_tokens"] > 0 and records["c.png"]["new_tokens"] > 0
    assert code == EXIT_ERROR and "2 captioned, 1 errors" in printed


@pytest.mark.parametrize(
    "flags", [["--batch-size", "0"], ["--batch-size", "2.5"], ["--kv-budget-gb", "0"], ["--kv-budget-gb", "nan"]]
)
def test_a_batch_size_or_memory_budget_out_of_range_is_refused_naming_the_flag(tmp_path, flags, capsys):
    code, _, err = caption(capsys, ("target", "draft"), [str(tmp_path)], tmp_path / "captions.jsonl", *flags)
    assert code == EXIT_CONFIGURATION and f"argument {flags[0]}: " in err


@pytest.mark.parametrize(("name", "value"), [("batch_size", 0), ("batch_size", True), ("kv_budget_gb", -1.0)])
def test_caption_settings_out_of_range_are_refused_before_any_model_loads(tmp_path, name, value):
    def no_model(state):
        raise AssertionError("the pair was loaded")

    settings = replace(SETTINGS, **{name: value})
    with pytest.raises(InvalidArgumentError, match=name):
        run_captioning(no_model, [str(tmp_path)], tmp_path / "captions.jsonl", settings, progress=False)


def test_the_command_lines_default_batch_size_is_the_librarys():
    args = build_parser().parse_args(["caption", "media", "--out", "captions.jsonl"])
    assert args.batch_size == CAPTION_BATCH_SIZE == DEFAULT_CAPTION_BATCH_SIZE and args.kv_budget_gb is None


def test_an_error_reading_an_input_that_is_not_the_inputs_fault_stops_the_job_at_it(
    pair, collection, tmp_path, monkeypatch
):
    load = captioning.load_input

    def failing(path, *args):
        if path.endswith("d.jpg"):
            raise RuntimeError("the decoder crashed")
        return load(path, *args)

    monkeypatch.setattr(captioning, "load_input", failing)
    out = tmp_path / "captions.jsonl"
    spec = load_pair(*pair, device_map=device_map())
    with pytest.raises(CaptioningStopped) as stopped:
        run_captioning(lambda state: spec, collection, out, replace(SETTINGS, batch_size=4), progress=False)
    assert Path(stopped.value.path).name == "d.jpg" and isinstance(stopped.value.error, RuntimeError)
    assert "d.jpg" not in {Path(r["path"]).name for r in read_records(out)}
