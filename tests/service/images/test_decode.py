"""Decoding untrusted bytes: what comes out of a good file, what each bad one is answered with,
and that a decompression bomb is refused before its pixels exist."""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.images import ImageError, ImageLimits, decode
from tests.service.images.samples import (
    animated,
    black_png,
    encode,
    exif_rotated_jpeg,
    gradient,
    noise,
    rgba,
    samples,
    sixteen_bit,
)

LIMITS = ImageLimits()


def refused(data: bytes, limits: ImageLimits = LIMITS) -> ImageError:
    with pytest.raises(ImageError) as caught:
        decode(data, limits)
    return caught.value


# What a good file becomes


@pytest.mark.parametrize("name, data", list(samples().items()))
def test_every_sample_becomes_an_rgb_image_of_its_size(name, data):
    image = decode(data, LIMITS)
    with Image.open(io.BytesIO(data)) as original:
        assert image.mode == "RGB" and image.size == original.size


def test_the_exif_orientation_is_applied():
    image = decode(exif_rotated_jpeg(120, 80), LIMITS)
    assert image.size == (80, 120)


@pytest.mark.parametrize("fmt, options", [("GIF", {}), ("WEBP", {"lossless": True})])
def test_an_animation_gives_its_first_frame(fmt, options):
    image = decode(animated(fmt, [(255, 0, 0), (0, 0, 255)], **options), LIMITS)
    assert image.getpixel((5, 5)) == (255, 0, 0)


def test_transparency_is_composited_onto_white():
    image = np.asarray(decode(encode(rgba(120, 90), "PNG"), LIMITS))
    assert (image[:, 0] == 255).all()  # the fully transparent column


def test_sixteen_bit_grey_is_clipped_to_255_as_pil_converts_it():
    values = np.asarray(sixteen_bit(140, 90))
    image = np.asarray(decode(encode(sixteen_bit(140, 90), "PNG"), LIMITS))[..., 0]
    assert (image == np.minimum(values, 255)).all()


def test_cmyk_and_palette_become_rgb():
    photo = noise(40, 30)
    for data in (encode(photo.convert("CMYK"), "JPEG"), encode(photo.quantize(16), "GIF")):
        assert decode(data, LIMITS).mode == "RGB"


# Bad files: the status, and a message naming the problem


def test_empty_bytes():
    err = refused(b"")
    assert err.status == 422 and "empty" in err.message


@pytest.mark.parametrize(
    "data",
    [
        b"hello, this is a text file\n",
        np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        b"\x00" * 100,
    ],
    ids=["text", "random bytes", "zeros"],
)
def test_not_an_image(data):
    err = refused(data)
    assert err.status == 422 and err.message.startswith("not an image (bytes start with")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_truncated_file(fmt):
    data = encode(noise(200, 150), fmt)
    err = refused(data[: len(data) // 2])
    assert err.status == 422 and fmt in err.message and "truncated" in err.message


@pytest.mark.parametrize(
    "data, name",
    [
        (encode(gradient(20, 10), "BMP"), "BMP"),
        (encode(gradient(20, 10), "TIFF"), "TIFF"),
        (encode(gradient(16, 16), "ICO"), "ICO"),
        (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "SVG"),
        (b"<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>", "SVG"),
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00", "HEIC"),
    ],
)
def test_other_image_formats_are_refused_with_415_naming_the_allowed_ones(data, name):
    err = refused(data)
    assert err.status == 415 and name in err.message
    assert "JPEG, PNG, WebP or GIF" in err.message


def test_a_zero_sized_image():
    err = refused(black_png(0, 10))
    assert err.status == 422 and "0 x 10" in err.message and "no pixels" in err.message


def test_too_many_bytes_is_413():
    data = encode(noise(64, 64), "PNG")
    err = refused(data, ImageLimits(max_bytes=len(data) - 1))
    assert err.status == 413
    assert err.message == f"image is {len(data)} bytes, over the {len(data) - 1} bytes limit"


def test_a_20000_square_png_bomb_is_refused_naming_its_size_and_the_limit():
    err = refused(black_png(20_000, 20_000))
    assert err.status == 413
    assert err.message == "image is 20000 x 20000 = 400 MP, over the 50 MP limit"


def test_a_bomb_in_a_jpeg_header_is_refused_before_pil_opens_it():
    data = bytearray(encode(gradient(32, 16), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (30_000).to_bytes(2, "big") + (40_000).to_bytes(2, "big")
    err = refused(bytes(data))
    assert err.status == 413 and "40000 x 30000 = 1.2e+03 MP" in err.message


@pytest.mark.parametrize(
    "frame, message",
    [
        ((8_000, 8_000), "image is 8000 x 8000 = 64 MP, over the 50 MP limit"),
        ((20_000, 20_000), "image is 400 MP, over the 50 MP limit"),  # PIL's own check
    ],
)
def test_a_gif_frame_larger_than_its_stated_screen_is_refused(frame, message):
    """A 1 x 1 screen in the header, a first frame that PIL grows the image to when it opens."""
    gif = (
        b"GIF89a" + struct.pack("<HH", 1, 1) + b"\x80\x00\x00" + b"\x00" * 3 + b"\xff" * 3
        + b"," + struct.pack("<HHHH", 0, 0, *frame) + b"\x00\x02\x02\x4c\x01\x00;"
    )  # fmt: skip
    err = refused(gif)
    assert err.status == 413 and err.message == message


def test_a_side_over_the_limit_is_413():
    err = refused(black_png(20_000, 2))
    assert err.status == 413 and "20000 x 2" in err.message and "16384 px limit" in err.message


def test_the_pixel_limit_is_the_callers():
    err = refused(encode(noise(200, 100), "PNG"), ImageLimits(max_pixels=10_000))
    assert (
        err.status == 413 and err.message == "image is 200 x 100 = 0.02 MP, over the 0.01 MP limit"
    )


def test_limits_stay_under_pils_own_bomb_threshold():
    with pytest.raises(ValueError, match="MAX_IMAGE_PIXELS"):
        ImageLimits(max_pixels=Image.MAX_IMAGE_PIXELS + 1)
    with pytest.raises(ValueError, match="positive"):
        ImageLimits(max_side=0)


def test_the_bomb_builder_makes_real_pngs():
    """The bomb above is a valid PNG, not a broken header: the same builder, small, decodes."""
    image = decode(black_png(300, 200), LIMITS)
    assert image.size == (300, 200) and image.getextrema() == ((0, 0), (0, 0), (0, 0))


@pytest.mark.parametrize(
    "name, data", list(samples().items())[:6] + [("GIF", animated("GIF", [(1, 2, 3), (4, 5, 6)]))]
)
def test_damaged_files_raise_only_image_errors(name, data):
    """Bytes flipped at random (seeded) anywhere in the file: a decoded image or an ImageError,
    never another exception."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for _ in range(40):
        damaged = bytearray(data)
        for at in rng.integers(0, len(data), 4):
            damaged[at] = rng.integers(0, 256)
        try:
            decode(bytes(damaged), LIMITS)
        except ImageError as e:
            assert e.status in (413, 415, 422)


def test_an_image_error_is_a_value_error_with_a_positioned_copy():
    err = refused(b"")
    assert isinstance(err, ValueError)
    assert err.at(1).message == "image 1: image is empty (0 bytes)" and err.at(1).status == 422


# Memory: the bomb is refused before anything is allocated for it


def peak_rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs sets the peak RSS (VmHWM) back to the current RSS, so
    what follows is measured alone, whatever this process held before."""
    Path("/proc/self/clear_refs").write_text("5")


def can_reset_peak_rss() -> bool:
    try:
        reset_peak_rss()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not can_reset_peak_rss(), reason="needs Linux's /proc/self/clear_refs")
def test_decoding_the_bomb_does_not_grow_the_process():
    """Refusing the 1.2 GB bomb raises the peak RSS by under 100 MB; decoding a real 16 MP
    image (48 MB of RGB), as a control that the measure sees decoding, by over 40 MB."""
    bomb, control = black_png(20_000, 20_000), black_png(4_000, 4_000)
    reset_peak_rss()
    before = peak_rss_mb()
    assert refused(bomb).status == 413
    assert peak_rss_mb() - before < 100
    reset_peak_rss()
    before = peak_rss_mb()
    decode(control, LIMITS)
    assert peak_rss_mb() - before > 40
