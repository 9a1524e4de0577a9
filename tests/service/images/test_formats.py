"""Reading the format and the stated size from a file's first bytes, as PIL would read them."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from service.images.formats import header_size, sniff
from tests.service.images.samples import animated, encode, gradient, noise, samples

FILES = {
    **samples(),
    "progressive JPEG": encode(noise(90, 70), "JPEG", progressive=True),
    "lossless WebP (VP8L)": encode(noise(90, 70), "WEBP", lossless=True),
    "animated WebP (VP8X)": animated("WEBP", [(255, 0, 0), (0, 0, 255)], lossless=True),
    "animated GIF": animated("GIF", [(255, 0, 0), (0, 0, 255)]),
    "JPEG with EXIF": encode(gradient(50, 40), "JPEG", exif=Image.Exif().tobytes()),
}


@pytest.mark.parametrize("name", list(FILES))
def test_the_header_states_the_size_pil_opens(name):
    data = FILES[name]
    with Image.open(io.BytesIO(data)) as image:
        assert sniff(data) == image.format
        assert header_size(data, image.format) == image.size


def test_a_jpeg_without_a_frame_header_states_no_size():
    assert header_size(b"\xff\xd8\xff\xda\x00\x02", "JPEG") is None
    assert header_size(b"\xff\xd8\xff", "JPEG") is None
