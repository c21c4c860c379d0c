"""A deterministic synthetic captioning suite: coloured shapes in images and short videos, with long captions.

Each item is drawn from its seed. Captions come from a stochastic grammar: some spans are fixed by the picture
(counts, colours, shapes, sizes, positions, motion, colour changes), others are free choices (phrasing, object
order, connectives, filler remarks), so the next-token entropy rises and falls along a caption as it does in
real captions. Training items use seeds below `HELD_OUT_BASE`; held-out items use seeds from it on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 180),
    "orange": (240, 140, 30),
    "white": (245, 245, 245),
    "black": (25, 25, 25),
}
BACKGROUNDS = {"grey": (128, 128, 128), "beige": (225, 210, 180), "dark blue": (20, 30, 70)}
SHAPES = ("circle", "square", "triangle", "diamond")
SIZES = {"small": 0.2, "large": 0.34}
CELLS = {
    "top left": (0, 0),
    "top": (1, 0),
    "top right": (2, 0),
    "left": (0, 1),
    "center": (1, 1),
    "right": (2, 1),
    "bottom left": (0, 2),
    "bottom": (1, 2),
    "bottom right": (2, 2),
}
MOTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}
NUMBERS = ("zero", "one", "two", "three", "four")
HELD_OUT_BASE = 1_000_000_000
IMAGE_SIZE = 112
VIDEO_FRAMES = 8
VIDEO_FPS = 2.0
IMAGE_PROMPT = "Describe the image in detail."
VIDEO_PROMPT = "Describe the video in detail."


@dataclass
class Shape:
    colour: str
    shape: str
    size: str
    cell: str
    motion: str = "still"
    new_colour: str | None = None


@dataclass
class Item:
    """One suite item: its pictures (one image, or video frames), prompt, caption and ground truth."""

    seed: int
    kind: str
    background: str
    shapes: list[Shape]
    caption: str
    frames: list[Image.Image] = field(repr=False)

    @property
    def prompt(self) -> str:
        return VIDEO_PROMPT if self.kind == "video" else IMAGE_PROMPT

    @property
    def image(self) -> Image.Image:
        return self.frames[0]

    @property
    def video(self) -> np.ndarray:
        return np.stack([np.asarray(f) for f in self.frames])


def make_item(seed: int, kind: str | None = None, num_frames: int = VIDEO_FRAMES, size: int = IMAGE_SIZE) -> Item:
    """The item for `seed`; `kind` ("image" or "video") defaults to the seed's parity. A video has `num_frames`
    frames; pictures are `size` pixels square (the scene and its caption do not depend on either)."""
    rng = random.Random(seed)
    kind = kind or ("video" if seed % 2 else "image")
    background = rng.choice(list(BACKGROUNDS))
    count = rng.randint(2, 4)
    cells = rng.sample(list(CELLS), count)
    shapes = []
    for cell in cells:
        colour = rng.choice(list(COLOURS))
        shape = Shape(colour, rng.choice(SHAPES), rng.choice(list(SIZES)), cell)
        if kind == "video":
            shape.motion = rng.choice(list(MOTIONS))
            if rng.random() < 0.3:
                shape.new_colour = rng.choice([c for c in COLOURS if c != colour])
        shapes.append(shape)
    frames = render(background, shapes, num_frames if kind == "video" else 1, size)
    return Item(seed, kind, background, shapes, caption(rng, kind, background, shapes), frames)


def render(background: str, shapes: list[Shape], num_frames: int, size: int = IMAGE_SIZE) -> list[Image.Image]:
    """Draw the scene; in a video each shape drifts along its motion and may change colour halfway."""
    frames = []
    cell = size / 3
    for t in range(num_frames):
        progress = t / max(1, num_frames - 1)
        image = Image.new("RGB", (size, size), BACKGROUNDS[background])
        draw = ImageDraw.Draw(image)
        for s in shapes:
            cx, cy = CELLS[s.cell]
            dx, dy = MOTIONS[s.motion]
            x = (cx + 0.5) * cell + dx * progress * cell * 0.8
            y = (cy + 0.5) * cell + dy * progress * cell * 0.8
            r = SIZES[s.size] * size / 2
            colour = COLOURS[s.new_colour if s.new_colour and t >= num_frames // 2 else s.colour]
            box = (x - r, y - r, x + r, y + r)
            if s.shape == "circle":
                draw.ellipse(box, fill=colour)
            elif s.shape == "square":
                draw.rectangle(box, fill=colour)
            elif s.shape == "triangle":
                draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
            else:
                draw.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=colour)
        frames.append(image)
    return frames


def _where(cell: str) -> str:
    return "in the center" if cell == "center" else f"in the {cell}" if " " in cell else f"at the {cell}"


def caption(rng: random.Random, kind: str, background: str, shapes: list[Shape]) -> str:
    """A long description: the facts are fixed by the scene, the wording is drawn from `rng`."""
    medium = "video" if kind == "video" else rng.choice(["image", "picture"])
    n = NUMBERS[len(shapes)]
    noun = rng.choice(["shapes", "objects"])
    sentences = [
        rng.choice(
            [
                f"The {medium} shows {n} {noun} on a {background} background.",
                f"In this {medium} there are {n} {noun} against a plain {background} background.",
                f"We see {n} coloured {noun} placed on a {background} background.",
            ]
        )
    ]
    order = shapes[:]
    rng.shuffle(order)
    connectives = ["First,", "Next,", "Then,", "Also,", "In addition,", "Besides that,"]
    for i, s in enumerate(order):
        lead = connectives[0] if i == 0 else rng.choice(connectives[1:])
        if i == len(order) - 1 and len(order) > 1:
            lead = rng.choice(["Finally,", "Last of all,", lead])
        sentences.extend(_shape_sentences(rng, lead, s))
        if kind == "video":
            sentences.extend(_change_sentences(rng, s))
    sentences.append(
        rng.choice(
            [
                "Nothing else is visible in the scene.",
                f"There is no text anywhere in the {medium}.",
                "The whole scene is simple and uncluttered.",
            ]
        )
    )
    return " ".join(sentences)


def _shape_sentences(rng: random.Random, lead: str, s: Shape) -> list[str]:
    """What a shape is and where it sits, then how it looks, the first sentence opening with `lead`."""
    return [
        rng.choice(
            [
                f"{lead} there is a {s.size} {s.colour} {s.shape} {_where(s.cell)} of the frame.",
                f"{lead} a {s.size} {s.colour} {s.shape} sits {_where(s.cell)}.",
                f"{lead} you can see a {s.colour} {s.shape}; it is {s.size} and placed {_where(s.cell)}.",
            ]
        ),
        rng.choice(
            [
                "Its edges are clean and sharp.",
                "It looks flat, with no shadow at all.",
                "The shape is filled with one solid colour.",
                "It stands out clearly from the background.",
                f"The {s.shape} has a simple, even outline.",
            ]
        ),
    ]


def _change_sentences(rng: random.Random, s: Shape) -> list[str]:
    """How a shape changes during a video: its motion (or that it stays still), then its new colour if it has one."""
    if s.motion == "still":
        sentences = [rng.choice(["It does not move during the clip.", "It stays in place the whole time."])]
    else:
        sentences = [
            rng.choice(
                [
                    f"During the clip it moves slowly {s.motion}.",
                    f"Over time the {s.shape} drifts {s.motion}.",
                    f"As the video plays, it slides {s.motion}.",
                ]
            )
        ]
    if s.new_colour:
        sentences.append(
            rng.choice(
                [
                    f"Halfway through, it turns {s.new_colour}.",
                    f"In the middle of the video its colour changes to {s.new_colour}.",
                ]
            )
        )
    return sentences


def items(split: str, count: int, start: int = 0) -> list[Item]:
    """`count` items of the `train` or `held-out` split, alternating images and videos."""
    base = {"train": 0, "held-out": HELD_OUT_BASE}[split]
    return [make_item(base + start + i) for i in range(count)]


def corpus(count: int = 4000) -> list[str]:
    """Text for training the tokenizer: prompts and captions of training items (captions only, no rendering)."""
    texts = [IMAGE_PROMPT, VIDEO_PROMPT]
    for seed in range(count):
        rng = random.Random(seed)
        kind = "video" if seed % 2 else "image"
        background = rng.choice(list(BACKGROUNDS))
        shapes = [
            Shape(
                rng.choice(list(COLOURS)),
                rng.choice(SHAPES),
                rng.choice(list(SIZES)),
                cell,
                rng.choice(list(MOTIONS)),
                rng.choice([None, "red", "blue"]),
            )
            for cell in rng.sample(list(CELLS), rng.randint(2, 4))
        ]
        texts.append(caption(rng, kind, background, shapes))
    return texts


def write_clip(path: str | Path, frames: Sequence[np.ndarray], fps: float, bit_rate: int | None = None) -> None:
    """An MP4 (MPEG-4 part 2, yuv420p) of RGB `frames` `(H, W, 3)` at `fps` (PyAV, a development dependency)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=int(fps))
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
