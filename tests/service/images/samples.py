"""Image files built in the tests: photos of noise, the modes PIL can write, and PNGs crafted
byte by byte (a zero-width image, a 20,000 x 20,000 bomb) that no encoder would make."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def noise(width: int, height: int, seed: int = 0, channels: int = 3) -> Image.Image:
    rng = np.random.default_rng(seed)
    shape = (height, width, channels) if channels > 1 else (height, width)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))


def gradient(width: int, height: int) -> Image.Image:
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, 255 - x], -1).astype(np.uint8))


def rgba(width: int, height: int) -> Image.Image:
    """Noise with an alpha ramp from fully transparent to opaque, left to right."""
    pixels = np.asarray(noise(width, height, seed=1, channels=4)).copy()
    pixels[..., 3] = np.linspace(0, 255, width).astype(np.uint8)[None, :]
    return Image.fromarray(pixels, "RGBA")


def sixteen_bit(width: int, height: int) -> Image.Image:
    """A 16-bit grey image ("I;16") whose values run 0..1023, most of them past 255."""
    values = np.linspace(0, 1023, width * height).reshape(height, width).astype(np.uint16)
    return Image.fromarray(values)


def exif_rotated_jpeg(width: int, height: int) -> bytes:
    """A JPEG stored `width` x `height` whose EXIF says "rotate 90 degrees clockwise" (6)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(gradient(width, height), "JPEG", exif=exif, quality=95)


def animated(fmt: str, colours: list[tuple[int, int, int]], **options: object) -> bytes:
    frames = [Image.new("RGB", (32, 24), c) for c in colours]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, **options)


def samples() -> dict[str, bytes]:
    """One file per case the parity tests run through transformers and through headwise."""
    photo = noise(301, 197)
    return {
        "noise 301x197 PNG": encode(photo, "PNG"),
        "noise 97x413 PNG": encode(noise(97, 413, seed=2), "PNG"),
        "gradient PNG": encode(gradient(256, 160), "PNG"),
        "noise JPEG": encode(photo, "JPEG", quality=90),
        "RGBA PNG": encode(rgba(120, 90), "PNG"),
        "LA PNG": encode(rgba(120, 90).convert("LA"), "PNG"),
        "grey L PNG": encode(noise(150, 100, seed=3, channels=1), "PNG"),
        "palette GIF, transparent index": encode(photo.quantize(64), "GIF", transparency=0),
        "CMYK JPEG": encode(photo.convert("CMYK"), "JPEG", quality=90),
        "16-bit PNG": encode(sixteen_bit(140, 90), "PNG"),
        "WebP": encode(photo, "WEBP", quality=90),
        "tiny 7x5 PNG": encode(noise(7, 5, seed=4), "PNG"),
    }


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def zeros_zlib(n: int) -> bytes:
    """A zlib stream of `n` zero bytes, about n / 1032 bytes long, built without holding `n`
    bytes: one full-flushed megabyte of deflate (no reference outside itself) repeated, a final
    block for the rest, and the Adler-32 of n zeros, which is (n mod 65521) << 16 | 1."""
    unit_size = 1 << 20
    unit = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = unit.compress(bytes(unit_size)) + unit.flush(zlib.Z_FULL_FLUSH)
    full, rest = divmod(n, unit_size)
    last = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = last.compress(bytes(rest)) + last.flush()
    return b"\x78\xda" + block * full + tail + struct.pack(">I", (n % 65521) << 16 | 1)


def black_png(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of `width` x `height` black pixels, whatever the size, zero included:
    a 20,000 x 20,000 one is 1.2 GB of pixels in about 1.1 MB of file."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = height * (1 + 3 * width)  # a filter byte (0: none) then the row's RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zeros_zlib(rows))
        + chunk(b"IEND", b"")
    )
