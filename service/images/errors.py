"""The one error image input raises: a message naming the problem, and the status it maps to.

It is a `HeadwiseError`, so `service.http.errors` renders it like every other domain error, and a
`ValueError`, so code that only knows "bad input" can still catch it.
"""

from __future__ import annotations

from service.errors import HeadwiseError

# The dialects' error kinds for the statuses image input answers with.
KINDS = {
    400: "invalid_request_error",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request_error",
}


class ImageError(HeadwiseError, ValueError):
    """An image reference or its bytes that cannot become pixels.

    `status`: 413 too many bytes or pixels, 415 a format we do not take, 400 a URL the operator
    does not allow, 422 anything else malformed (corrupt data, bad base64, a failed fetch).
    """

    def __init__(self, message: str, status: int = 422) -> None:
        if status not in KINDS:
            raise ValueError(f"ImageError status must be one of {sorted(KINDS)}, not {status}")
        super().__init__(message)
        self.status = status
        self.kind = KINDS[status]

    def at(self, index: int) -> ImageError:
        """The same error, its message prefixed with the input's position ("image 1: ...")."""
        return ImageError(f"image {index}: {self.message}", self.status)


def byte_size(n: int) -> str:
    """A byte count as the messages give it: "20 MB" (MiB, three significant figures), or
    "3072 bytes" under a megabyte."""
    return f"{n / 2**20:.3g} MB" if n >= 2**20 else f"{n} bytes"


def megapixels(pixels: int) -> str:
    """A pixel count as the messages give it: "400 MP"."""
    return f"{pixels / 1e6:.3g} MP"
