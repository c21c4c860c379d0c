"""Bad input, as a new user meets it on the demo pair: every kind gets the vlmspec error of its kind naming the file
or argument, through `vlmspec.generate` and through `vlmspec caption`, and a caption run carries on past bad files;
inputs with a sensible conversion are converted (as transformers converts, or as documented where it would not)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import FAMILIES, save_pair
from media_files import (
    write_animated_gif,
    write_audio_only,
    write_empty_video,
    write_image,
    write_rotated_jpeg,
    write_video,
    write_zero_time_scale_video,
)
from PIL import Image
from transformers.image_transforms import convert_to_rgb
from transformers.image_utils import load_image as transformers_load_image

import vlmspec
from vlmspec.api import load_pair
from vlmspec.cli import EXIT_CONFIGURATION, EXIT_ERROR, main
from vlmspec.errors import (
    ContextTooLongError,
    EmptyPromptError,
    InvalidArgumentError,
    MediaNotFoundError,
    MediaRejectedError,
    NoFramesError,
    NotAnImageError,
    PlaceholderMismatchError,
    PromptTypeError,
    UnreadableVideoError,
    UnsupportedMediaError,
)
from vlmspec.processors import Video, chat_messages, load_image, load_video
from vlmspec.processors.media import DEFAULT_FPS

KIND = {".mp4": "video"}


def _mode_image(mode: str, values: np.ndarray):
    return lambda path: Image.fromarray(values).convert(mode).save(path)


def _bytes_of(writer, cut: float = 1.0):
    """A writer of the first `cut` of the bytes `writer` produces."""

    def write(path: Path) -> None:
        scratch = path.with_name(f"scratch{path.suffix}")
        writer(scratch)
        data = scratch.read_bytes()
        scratch.unlink()
        path.write_bytes(data[: int(len(data) * cut)])

    return write


def _renamed(writer, suffix: str):
    """A writer of another format's file under `path`'s name (an mp4 named .png, a png named .mp4)."""

    def write(path: Path) -> None:
        writer(path.with_suffix(suffix))
        path.with_suffix(suffix).rename(path)

    return write


RNG = np.random.default_rng(0)
NOISE = RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8)

#: Files no conversion can save: each name, how it is written, and the error it gets.
REFUSED = {
    "tall.png": (lambda p: write_image(p, size=(4000, 10)), MediaRejectedError),
    "wide.png": (lambda p: write_image(p, size=(10, 4000)), MediaRejectedError),
    "tall_clip.mp4": (lambda p: write_video(p, num_frames=4, size=(16, 4000)), MediaRejectedError),
    "huge.png": (lambda p: Image.new("1", (20000, 10000)).save(p), NotAnImageError),
    "truncated.png": (_bytes_of(write_image, cut=0.3), NotAnImageError),
    "empty.jpg": (lambda p: p.write_bytes(b""), NotAnImageError),
    "shopping_list.jpg": (lambda p: p.write_text("eggs, milk, bread\n"), NotAnImageError),
    "clip_named.png": (_renamed(write_video, ".mp4"), NotAnImageError),
    "random_bytes.mp4": (
        lambda p: p.write_bytes(RNG.integers(0, 256, 4000, dtype=np.uint8).tobytes()),
        UnreadableVideoError,
    ),
    "empty.mp4": (lambda p: p.write_bytes(b""), UnreadableVideoError),
    "truncated.mp4": (_bytes_of(lambda p: write_video(p, num_frames=20), cut=0.5), UnreadableVideoError),
    "picture_named.mp4": (_renamed(write_image, ".png"), UnreadableVideoError),
    "audio_only.mp4": (write_audio_only, NoFramesError),
    "no_frames.mp4": (write_empty_video, NoFramesError),
}
#: Files named in a list file (folders are searched for media extensions only): a document and a path that is gone.
LISTED = {
    "notes.pdf": (lambda p: p.write_text("%PDF-1.4 not really\n"), UnsupportedMediaError),
    "gone.png": (lambda p: None, MediaNotFoundError),
}

#: Files a sensible conversion saves: each is captioned (what each conversion gives is tested below).
CONVERTED = {
    "one_pixel.png": lambda p: write_image(p, size=(1, 1)),
    "cmyk.jpg": _mode_image("CMYK", NOISE),
    "palette_with_transparency.png": lambda p: Image.fromarray(NOISE).convert("P").save(p, transparency=0),
    "animated.gif": write_animated_gif,
    "sixteen_bit.png": lambda p: Image.fromarray(RNG.integers(0, 65536, (40, 50), dtype=np.uint16)).save(p),
    "float.tif": lambda p: Image.fromarray(RNG.random((40, 50), dtype=np.float32)).save(p),
    "rgba.png": lambda p: Image.fromarray(RNG.integers(0, 256, (40, 50, 4), dtype=np.uint8)).save(p),
    "bilevel.png": _mode_image("1", NOISE),
    "sideways_phone_photo.jpg": write_rotated_jpeg,
    "one_frame.mp4": lambda p: write_video(p, num_frames=1),
    "no_frame_rate.mp4": write_zero_time_scale_video,
}


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    """A folder of every refused and converted file and one good image and video, plus a list file of the rest."""
    root = tmp_path_factory.mktemp("bad")
    folder = root / "collection"
    folder.mkdir()
    for name, (write, _) in REFUSED.items():
        write(folder / name)
    for name, write in CONVERTED.items():
        write(folder / name)
    write_image(folder / "good.png", seed=5)
    write_video(folder / "good.mp4", num_frames=20)
    for name, (write, _) in LISTED.items():
        write(root / name)
    (root / "listed.txt").write_text("".join(f"{root / name}\n" for name in LISTED))
    return root


def _kind(name: str) -> str:
    return KIND.get(Path(name).suffix, "image")


def _describe(path: Path, **kwargs) -> str:
    media = {"videos" if _kind(path.name) == "video" else "images": str(path)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vlmspec.generate("Describe it.", max_new_tokens=4, num_frames=4 if "videos" in media else None, **media)


@pytest.mark.parametrize("name", sorted({**REFUSED, **LISTED}))
def test_generate_refuses_each_bad_file_with_its_error_naming_it(media, name):
    error = {**REFUSED, **LISTED}[name][1]
    path = (media / "collection" / name) if name in REFUSED else media / name
    with pytest.raises(error, match=re.escape(str(path))):
        _describe(path)


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_generate_captions_each_convertible_file(media, name):
    assert isinstance(_describe(media / "collection" / name), str)


def test_caption_records_each_bad_file_and_carries_on(media, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    args = ["caption", str(media / "collection"), str(media / "listed.txt"), "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--num-frames", "4", "--max-new-tokens", "4"])
    assert exit_.value.code == EXIT_ERROR
    records = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    bad = {**REFUSED, **LISTED}
    assert set(records) == {*bad, *CONVERTED, "good.png", "good.mp4"}
    for name, (_, error) in bad.items():
        assert records[name]["error_type"] == error.__name__, records[name]
        assert records[name]["path"] in records[name]["error"]
    for name in [*CONVERTED, "good.png", "good.mp4"]:
        assert "caption" in records[name], records[name]
    assert f"{len(CONVERTED) + 2} captioned, {len(bad)} errors" in capsys.readouterr().out


#: Arguments of `vlmspec.generate` out of range: the keyword arguments, the error and what its message names.
BAD_ARGUMENTS = {
    "zero_frames": (dict(num_frames=0), InvalidArgumentError, "num_frames"),
    "negative_frames": (dict(num_frames=-3), InvalidArgumentError, "num_frames"),
    "fractional_frames": (dict(num_frames=2.5), InvalidArgumentError, "num_frames"),
    "zero_fps": (dict(fps=0), InvalidArgumentError, "fps"),
    "negative_fps": (dict(fps=-1.5), InvalidArgumentError, "fps"),
    "infinite_fps": (dict(fps=float("inf")), InvalidArgumentError, "fps"),
    "zero_max_frames": (dict(fps=1.0, max_frames=0), InvalidArgumentError, "max_frames"),
    "frames_and_fps": (dict(num_frames=4, fps=1.0), InvalidArgumentError, "exclusive"),
    "zero_new_tokens": (dict(max_new_tokens=0), InvalidArgumentError, "max_new_tokens"),
    "negative_new_tokens": (dict(max_new_tokens=-1), InvalidArgumentError, "max_new_tokens"),
    "fractional_new_tokens": (dict(max_new_tokens=1.5), InvalidArgumentError, "max_new_tokens"),
    "negative_start": (dict(start=-1.0), InvalidArgumentError, "start"),
    "reversed_span": (dict(start=1.5, end=0.5), InvalidArgumentError, "end (0.5 s) must come after start (1.5 s)"),
    "empty_span": (dict(start=1.0, end=1.0), InvalidArgumentError, "must come after start"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_generate_refuses_each_bad_argument_naming_it(media, case):
    kwargs, error, named = BAD_ARGUMENTS[case]
    with pytest.raises(error, match=re.escape(named)):
        vlmspec.generate("Describe it.", videos=str(media / "collection" / "good.mp4"), **kwargs)


#: The same through `vlmspec caption`: the flags, and what the message names. The run stops before any record.
BAD_FLAGS = {
    "zero_frames": (["--num-frames", "0"], "--num-frames"),
    "zero_fps": (["--fps", "0"], "--fps"),
    "zero_max_frames": (["--max-frames", "0"], "--max-frames"),
    "zero_new_tokens": (["--max-new-tokens", "0"], "--max-new-tokens"),
    "negative_start": (["--start", "-1"], "--start"),
    "reversed_span": (["--start", "1.5", "--end", "0.5"], "end (0.5 s) must come after start (1.5 s)"),
    "empty_prompt": (["--prompt", ""], "prompt is empty"),
    "blank_prompt": (["--prompt", "   "], "prompt is empty"),
    "two_image_markers": (["--prompt", "Compare <image> with <image>."], "fits no input"),
    "both_markers": (["--prompt", "Compare <image> with <video>."], "fits no input"),
    "prompt_beyond_context": (["--prompt", "Describe it. " * 600], "the prompt alone"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_caption_stops_on_each_bad_setting_before_any_record(media, tmp_path, capsys, case):
    flags, named = BAD_FLAGS[case]
    out = tmp_path / "captions.jsonl"
    with pytest.raises(SystemExit) as exit_:
        main(["caption", str(media / "collection" / "good.png"), "--out", str(out), "--no-progress", *flags])
    assert exit_.value.code == EXIT_CONFIGURATION
    assert named in capsys.readouterr().err
    assert not out.exists()


#: Prompts and media of the wrong kind for `vlmspec.generate`: the call, the error and what its message names.
BAD_CALLS = {
    "prompt_not_a_string": (lambda m: vlmspec.generate(5, images=m["image"]), PromptTypeError, "int 5"),
    "prompt_list_holding_a_number": (
        lambda m: vlmspec.generate(["Describe it.", 7], images=m["image"]),
        PromptTypeError,
        "prompt[1]",
    ),
    "empty_prompt_list": (lambda m: vlmspec.generate([], images=m["image"]), PromptTypeError, "non-empty"),
    "empty_prompt": (lambda m: vlmspec.generate("", images=m["image"]), EmptyPromptError, "empty"),
    "blank_prompt": (lambda m: vlmspec.generate(" \n ", images=m["image"]), EmptyPromptError, "empty"),
    "markers_but_no_text": (lambda m: vlmspec.generate("<image>", images=m["image"]), EmptyPromptError, "no text"),
    "more_markers_than_images": (
        lambda m: vlmspec.generate("Compare <image> with <image>.", images=m["image"]),
        PlaceholderMismatchError,
        "2 <image>",
    ),
    "video_marker_for_an_image": (
        lambda m: vlmspec.generate("What happens in <video>?", images=m["image"]),
        PlaceholderMismatchError,
        "1 <video>",
    ),
    "prompt_beyond_context": (
        lambda m: vlmspec.generate("Describe it. " * 600, images=m["image"], max_new_tokens=4),
        ContextTooLongError,
        "context of 2048 tokens",
    ),
    "new_tokens_beyond_context": (
        lambda m: vlmspec.generate("Describe it.", images=m["image"], max_new_tokens=4096),
        ContextTooLongError,
        "max_new_tokens is 4096",
    ),
    "image_is_a_number": (lambda m: vlmspec.generate("Describe it.", images=5), NotAnImageError, "int 5"),
    "second_image_is_a_dict": (
        lambda m: vlmspec.generate("Describe it.", images=[m["image"], {"path": m["image"]}]),
        NotAnImageError,
        "dict",
    ),
    "image_array_of_wrong_shape": (
        lambda m: vlmspec.generate("Describe it.", images=np.zeros((2, 8, 8, 3), np.uint8)),
        NotAnImageError,
        "(2, 8, 8, 3)",
    ),
    "video_array_of_wrong_shape": (
        lambda m: vlmspec.generate("Describe it.", videos=np.zeros((4, 8, 8), np.uint8)),
        UnreadableVideoError,
        "(4, 8, 8)",
    ),
    "empty_frame_list": (lambda m: vlmspec.generate("Describe it.", videos=[[]]), NoFramesError, "empty list"),
    "video_given_as_image": (
        lambda m: vlmspec.generate("Describe it.", images=m["video"]),
        UnsupportedMediaError,
        "good.mp4",
    ),
    "image_given_as_video": (
        lambda m: vlmspec.generate("Describe it.", videos=m["image"]),
        UnsupportedMediaError,
        "good.png",
    ),
    "folder_given_as_image": (
        lambda m: vlmspec.generate("Describe it.", images=m["folder"]),
        UnsupportedMediaError,
        "collection: a folder, not an image or video file",
    ),
    "refused_second_image": (
        lambda m: vlmspec.generate("Compare them.", images=[m["image"], m["tall"]]),
        MediaRejectedError,
        "tall.png: the model's processor refuses it (absolute aspect ratio",
    ),
    "refused_image_array": (
        lambda m: vlmspec.generate("Describe it.", images=np.zeros((4000, 10, 3), np.uint8)),
        MediaRejectedError,
        "images[0]",
    ),
    "start_past_the_clip": (
        lambda m: vlmspec.generate("Describe it.", videos=m["video"], start=30.0),
        NoFramesError,
        "start=30.0 s is past the end of the clip (2.00 s",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_generate_refuses_each_bad_prompt_or_medium_naming_it(media, case):
    call, error, named = BAD_CALLS[case]
    folder = media / "collection"
    paths = {"image": str(folder / "good.png"), "video": str(folder / "good.mp4"), "folder": str(folder)}
    paths["tall"] = str(folder / "tall.png")
    with pytest.raises(error, match=re.escape(named)):
        call(paths)


def test_the_int_prompt_of_a_new_user_is_a_type_error(media):
    with pytest.raises(TypeError, match="prompt must be a string"):
        vlmspec.generate(5, images=str(media / "collection" / "good.png"))


@pytest.mark.parametrize(
    ("flags", "code", "named"),
    [
        (["--image", "tall.png"], EXIT_ERROR, "tall.png: the model's processor refuses it"),
        (["--video", "audio_only.mp4"], EXIT_ERROR, "audio_only.mp4: no video stream"),
        (["--image", "good.png", "--max-new-tokens", "0"], EXIT_CONFIGURATION, "--max-new-tokens"),
        (
            ["--video", "good.mp4", "--start", "2", "--end", "1"],
            EXIT_CONFIGURATION,
            "end (1.0 s) must come after start (2.0 s)",
        ),
    ],
)
def test_generate_command_exits_1_for_a_bad_file_and_2_for_a_bad_argument(
    media, capsys, monkeypatch, flags, code, named
):
    monkeypatch.chdir(media / "collection")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "Describe it.", "--max-new-tokens", "4", *flags])
    assert exit_.value.code == code
    assert named in capsys.readouterr().err


def _caption_good_pair(media: Path, out: Path, *flags: str) -> dict[str, dict]:
    """`vlmspec caption` of the good image and video with `flags`; the records by file name."""
    folder = media / "collection"
    args = ["caption", str(folder / "good.png"), str(folder / "good.mp4"), "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--max-new-tokens", "4", *flags])
    assert exit_.value.code == EXIT_ERROR
    return {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}


def test_caption_records_inputs_a_marker_prompt_does_not_fit_and_captions_the_rest(media, tmp_path):
    records = _caption_good_pair(media, tmp_path / "captions.jsonl", "--prompt", "What happens in <video>?")
    assert records["good.png"]["error_type"] == "PlaceholderMismatchError"
    assert "good.png" in records["good.png"]["error"]
    assert "caption" in records["good.mp4"]


def test_caption_records_videos_a_start_time_lies_past_and_captions_the_rest(media, tmp_path):
    records = _caption_good_pair(media, tmp_path / "captions.jsonl", "--start", "30")
    assert records["good.mp4"]["error_type"] == "NoFramesError"
    assert "start=30.0 s is past the end" in records["good.mp4"]["error"]
    assert "caption" in records["good.png"]


@pytest.mark.parametrize("name", ["cmyk.jpg", "palette_with_transparency.png", "bilevel.png", "rgba.png"])
def test_other_modes_convert_to_rgb_as_transformers_image_processors_do(media, name):
    path = media / "collection" / name
    with Image.open(path) as image:
        expected = convert_to_rgb(image, return_numpy=True)
    np.testing.assert_array_equal(np.asarray(load_image(str(path))), expected)


def test_an_animated_gif_gives_its_first_frame(media):
    frame = np.asarray(load_image(str(media / "collection" / "animated.gif")))
    assert abs(float(frame.mean()) - 40) < 2


def test_sixteen_bit_images_keep_their_top_eight_bits_instead_of_clipping_to_white(media):
    path = media / "collection" / "sixteen_bit.png"
    with Image.open(path) as image:
        expected = (np.asarray(image, dtype=np.int64) >> 8).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(load_image(str(path))), np.repeat(expected[..., None], 3, axis=-1))


def test_float_images_in_the_unit_range_are_scaled_to_eight_bits(media):
    path = media / "collection" / "float.tif"
    with Image.open(path) as image:
        expected = np.rint(np.asarray(image, dtype=np.float64) * 255).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(load_image(str(path)))[..., 0], expected)


def test_a_sideways_phone_photo_is_turned_upright_as_transformers_loads_it(media):
    path = media / "collection" / "sideways_phone_photo.jpg"
    upright = load_image(str(path))
    assert upright.size == (40, 60)
    np.testing.assert_array_equal(np.asarray(upright), np.asarray(transformers_load_image(str(path))))


def test_a_clip_without_a_frame_rate_is_read_at_the_assumed_rate_with_a_warning(media):
    path = media / "collection" / "no_frame_rate.mp4"
    with pytest.warns(UserWarning, match=re.escape(f"{path}: the container states no usable frame rate")):
        video = load_video(str(path))
    assert video.fps == DEFAULT_FPS


def _greedy_reference(spec, text: str, **media) -> str:
    """The target's own greedy text for its processor's inputs, as `model.generate` gives it."""
    inputs = spec.processor(spec.processor.apply_chat_template(chat_messages(text, **media_counts(media))), **media)
    ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=12)
    return spec.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def media_counts(media: dict) -> dict[str, int]:
    return {"num_images": len(media.get("images", [])), "num_videos": len(media.get("videos", []))}


def test_a_transparent_pil_image_decodes_as_the_processor_given_it_does():
    rgba = Image.fromarray(RNG.integers(0, 256, (48, 64, 4), dtype=np.uint8), "RGBA")
    on_white = np.asarray(load_image(rgba))
    np.testing.assert_array_equal(on_white, convert_to_rgb(rgba, return_numpy=True))
    assert not np.array_equal(on_white, np.asarray(rgba.convert("RGB")))
    spec = load_pair()
    text = vlmspec.generate("Describe it.", images=rgba, max_new_tokens=12, do_sample=False)
    inputs = spec.processor.processor(
        text=[spec.processor.apply_chat_template(chat_messages("Describe it.", 1))], images=[rgba], return_tensors="pt"
    )
    ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=12)
    assert text == spec.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_a_sixteen_bit_file_decodes_as_its_eight_bit_image(media):
    path = media / "collection" / "sixteen_bit.png"
    with Image.open(path) as image:
        eight_bit = Image.fromarray((np.asarray(image, dtype=np.int64) >> 8).astype(np.uint8)).convert("RGB")
    expected = _greedy_reference(load_pair(), "Describe it.", images=[eight_bit])
    assert vlmspec.generate("Describe it.", images=str(path), max_new_tokens=12, do_sample=False) == expected


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory) -> tuple[str, str]:
    return save_pair(FAMILIES["qwen3_vl"], tmp_path_factory.mktemp("qwen3"))


def test_a_one_frame_clip_reaches_qwen3_vl_padded_to_its_temporal_patch(media, qwen3_pair):
    path = str(media / "collection" / "one_frame.mp4")
    model, draft = qwen3_pair
    spec = load_pair(model, draft)
    clip = load_video(path, sampling=spec.processor.frame_sampling)
    assert len(clip.frames) == 1 and spec.processor.min_video_frames == 2
    doubled = Video(np.repeat(clip.frames, 2, axis=0), [0, 0], clip.fps, path, total_frames=1)
    expected = _greedy_reference(spec, "Describe it.", videos=[doubled])
    text = vlmspec.generate("Describe it.", videos=path, model=model, draft=draft, max_new_tokens=12, do_sample=False)
    assert text == expected


def test_an_image_whose_exif_pillow_cannot_read_is_used_as_stored_with_a_warning(media, monkeypatch):
    path = media / "collection" / "sideways_phone_photo.jpg"

    def broken_exif(image):
        raise ZeroDivisionError("division by zero")  # as Pillow 11.0 raised on some malformed EXIF blocks

    monkeypatch.setattr("vlmspec.processors.media.ImageOps.exif_transpose", broken_exif)
    with pytest.warns(UserWarning, match=re.escape(f"{path}: malformed EXIF data")):
        image = load_image(str(path))
    assert image.size == (60, 40)
