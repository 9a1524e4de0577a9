"""Untrusted bytes to an upright RGB image, refusing what would cost too much before paying it.

The order is the defence: the byte count first; then the format, from the magic bytes, so only
the JPEG, PNG, WebP and GIF plugins ever parse anything; then the dimensions, from the header
(`formats.header_size`) and again from PIL's lazy `Image.open`, refused when zero or over the
limits, so a decompression bomb (a 1 MB PNG that would inflate to 20,000 x 20,000 RGB pixels,
1.2 GB) is never decoded; only then the pixels, whose truncation or corruption becomes an
`ImageError` like every other PIL failure. PIL's own bomb check (DecompressionBombError, over
twice Image.MAX_IMAGE_PIXELS) becomes a 413 too. `ImageLimits` stays under MAX_IMAGE_PIXELS, so
PIL's DecompressionBombWarning never fires for an image we take; it can fire (a log line, no
more) for a GIF whose first frame overflows the screen its header states, refused just after.

What the service sees matches transformers' PIL processors fed the same file:

* the first frame of an animated GIF or WebP (what `Image.open` gives, as in `load_image`);
* the EXIF orientation applied (`ImageOps.exif_transpose`, as `load_image` does);
* RGB via `preprocessing.to_rgb`, the processor's own conversion: transparency (an alpha band,
  or a PNG/GIF transparent colour) is composited onto white; CMYK, palette and grey become RGB
  by PIL's `convert("RGB")`. `load_image` alone would drop alpha instead (`convert("RGB")` keeps
  the colour under transparent pixels); we follow the processor, which sees the file's alpha
  when it is given `Image.open`'s image, as sentence-transformers gives it;
* 16-bit grey PNGs ("I;16") are clipped by `convert("RGB")`, not scaled: a value v becomes
  min(v, 255), so most 16-bit images come out near white. transformers does the same (its
  processor calls the same `convert`); 16-bit RGB(A) PNGs PIL reads as 8-bit (the high byte);
* embedded ICC colour profiles are ignored, as transformers ignores them.

Memory: a decoded image holds 3 to 4 bytes a pixel; converting one with transparency briefly
holds about 16 (RGBA, white, composite, RGB), so 50 MP peaks near 800 MB. Callers bound how many
decodes run at once.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image, ImageOps

from service.images.errors import ImageError, byte_size, megapixels
from service.images.formats import header_size, sniff
from service.images.preprocessing import to_rgb


@dataclass(frozen=True)
class ImageLimits:
    """What one image may cost. `max_pixels` 50 MP takes a 50 MP phone photo (8160 x 6120) and
    stays under PIL's own bomb threshold (89.5 MP), so PIL never warns about an image we take;
    `max_side` 16,384 is WebP's own maximum and above any camera's."""

    max_bytes: int = 20 * 2**20
    max_pixels: int = 50_000_000
    max_side: int = 16_384

    def __post_init__(self) -> None:
        if min(self.max_bytes, self.max_pixels, self.max_side) <= 0:
            raise ValueError(f"image limits must be positive: {self}")
        if Image.MAX_IMAGE_PIXELS is not None and self.max_pixels > Image.MAX_IMAGE_PIXELS:
            raise ValueError(
                f"max_pixels {self.max_pixels} is over PIL's Image.MAX_IMAGE_PIXELS "
                f"({Image.MAX_IMAGE_PIXELS}), where PIL warns and then refuses by itself"
            )


def decode(data: bytes, limits: ImageLimits) -> Image.Image:
    """An upright RGB image from a JPEG, PNG, WebP or GIF file; `ImageError` for anything else."""
    if not data:
        raise ImageError("image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"image is {byte_size(len(data))}, over the {byte_size(limits.max_bytes)} limit", 413
        )
    fmt = sniff(data)
    if (stated := header_size(data, fmt)) is not None:
        check_size(stated, limits)  # before any PIL plugin allocates for it
    with pil_errors(fmt, "unreadable", limits):
        image = Image.open(io.BytesIO(data), formats=[fmt])  # the header only
    check_size(image.size, limits)
    with pil_errors(fmt, "truncated or corrupt", limits):
        image.load()
    with pil_errors(fmt, "unusable", limits):
        ImageOps.exif_transpose(image, in_place=True)
        return to_rgb(image)


def check_size(size: tuple[int, int], limits: ImageLimits) -> None:
    """Refuse an image with no pixels, or one over the limits, from the size it states."""
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageError(f"image is {width} x {height}: it has no pixels")
    if width * height > limits.max_pixels:
        raise ImageError(
            f"image is {width} x {height} = {megapixels(width * height)}, "
            f"over the {megapixels(limits.max_pixels)} limit",
            413,
        )
    if max(width, height) > limits.max_side:
        raise ImageError(
            f"image is {width} x {height}, a side over the {limits.max_side} px limit", 413
        )


@contextmanager
def pil_errors(fmt: str, what: str, limits: ImageLimits) -> Iterator[None]:
    """Any PIL failure in the block as an ImageError naming the format; memory errors pass."""
    try:
        yield
    except (ImageError, MemoryError):
        raise
    except Image.DecompressionBombError as e:
        # PIL's own check, in `open` or a GIF frame: over 2 x MAX_IMAGE_PIXELS, so over ours.
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = megapixels(int(found.group(1))) if found else "over PIL's bomb threshold"
        raise ImageError(
            f"image is {size}, over the {megapixels(limits.max_pixels)} limit", 413
        ) from None
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ...
        raise ImageError(f"{what} {fmt}: {e}") from None
