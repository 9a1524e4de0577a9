"""Captioned pictures for the vision tower's int8 gate: coloured shapes on coloured grounds,
each with the caption that says what it shows ("a red circle on a blue background").

No image-caption set ships on PyPI; these are drawn here, deterministic, and say something an
image-text model reads (colours and shapes are what CLIP and SigLIP get right zero-shot). The
gate holds an int8 tower's image -> caption retrieval to the fp32 tower's on them: what it
measures is what quantisation changes, on pictures of photo-like sizes with noise and blur.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

COLOURS = {
    "red": (220, 30, 30),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 220, 40),
    "purple": (140, 50, 170),
    "orange": (250, 140, 20),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
SHAPES = ("circle", "square", "triangle")
CORPUS = "captioned shapes (export/shapes.py): image -> caption"


@dataclass(frozen=True)
class Captioned:
    image: Image.Image
    caption: str


def draw(shape: str, colour: str, ground: str, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    w, h = size
    noise = rng.normal(0, 10, (h, w, 3))
    pixels = np.clip(np.asarray(COLOURS[ground], dtype=np.float64) + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    pen = ImageDraw.Draw(image)
    side = int(min(w, h) * rng.uniform(0.35, 0.6))
    x0 = int(rng.integers(0, w - side + 1))
    y0 = int(rng.integers(0, h - side + 1))
    box = (x0, y0, x0 + side, y0 + side)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(x0 + side // 2, y0), (x0, y0 + side), (x0 + side, y0 + side)], fill=fill)
    return image.filter(ImageFilter.GaussianBlur(0.8))


def captioned(count: int, seed: int = 0) -> list[Captioned]:
    """`count` pictures, every (shape, colour, ground) in turn (168 kinds), sizes of photos."""
    rng = np.random.default_rng(seed)
    kinds = [
        (s, c, g) for s in SHAPES for c in COLOURS for g in COLOURS if c != g
    ]  # 3 x 8 x 7
    order = rng.permutation(len(kinds))
    sizes = [(320, 240), (240, 320), (300, 300), (400, 300)]
    out = []
    for i in range(count):
        shape, colour, ground = kinds[order[i % len(kinds)]]
        image = draw(shape, colour, ground, sizes[i % len(sizes)], rng)
        out.append(Captioned(image, f"a {colour} {shape} on a {ground} background"))
    return out
