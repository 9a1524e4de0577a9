"""What a file is, and how big it says it is, from its first bytes, before PIL parses anything.

The format decides which single PIL plugin may open the file (the others, and their parsers,
never see untrusted bytes); the header's width and height let `decode` refuse a decompression
bomb with its real dimensions in the message, before any plugin allocates for it (PIL's WebP
plugin builds its canvas inside `Image.open`). Each reader follows the format's specification;
None where the header does not say (then the size PIL reports is checked instead).
"""

from __future__ import annotations

from service.images.errors import ImageError

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF")  # PIL's names
ALLOWED_NAMES = "JPEG, PNG, WebP or GIF"

# Formats recognised only to be refused with 415 (anything else unrecognised is a 422).
REFUSED_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"%PDF", "PDF"),
    (b"8BPS", "PSD"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)
HEIF_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"msf1": "HEIF", b"avif": "AVIF"}

# JPEG start-of-frame markers (they carry the size): C0-CF but for DHT, JPG and DAC.
JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RSTn, SOI: no length field


def sniff(data: bytes) -> str:
    """The PIL format name of an allowed file; `ImageError` 415 for an image format we do not
    take, 422 for anything else."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    name = refused_format(data)
    if name:
        raise ImageError(f"{name} images are not supported: send {ALLOWED_NAMES}", 415)
    raise ImageError(f"not an image (bytes start with {data[:8]!r})")


def refused_format(data: bytes) -> str | None:
    """The name of an image format we recognise but do not take, or None."""
    for magic, name in REFUSED_MAGIC:
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp" and data[8:12] in HEIF_BRANDS:
        return HEIF_BRANDS[data[8:12]]
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "SVG"
    return None


def header_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """(width, height) as the header of a file of format `fmt` (from `sniff`) states it."""
    if fmt == "PNG" and data[12:16] == b"IHDR" and len(data) >= 24:
        return be(data, 16, 4), be(data, 20, 4)
    if fmt == "GIF" and len(data) >= 10:  # the logical screen
        return le(data, 6, 2), le(data, 8, 2)
    if fmt == "WEBP":
        return webp_size(data)
    if fmt == "JPEG":
        return jpeg_size(data)
    return None


def webp_size(data: bytes) -> tuple[int, int] | None:
    """The canvas of a lossy (VP8), lossless (VP8L) or extended (VP8X) WebP."""
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        return le(data, 26, 2) & 0x3FFF, le(data, 28, 2) & 0x3FFF
    if chunk == b"VP8X" and len(data) >= 30:
        return le(data, 24, 3) + 1, le(data, 27, 3) + 1
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = le(data, 21, 4)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame size from the first SOF segment, walking the segments from SOI."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in JPEG_STANDALONE:
            i += 2
        elif marker in JPEG_SOF:
            return (be(data, i + 7, 2), be(data, i + 5, 2)) if i + 9 <= len(data) else None
        elif marker == 0xDA:  # start of scan: no frame header before it
            return None
        else:
            i += 2 + be(data, i + 2, 2)
    return None


def be(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at : at + n], "big")


def le(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at : at + n], "little")
