"""A request's image reference to the file's bytes: a data URI, bare base64, or an allowed URL.

Every size is checked before the bytes exist: base64 by its length (the decoded size is known
from it), a download by its Content-Length and then chunk by chunk, so a reference never costs
more than `max_bytes` (plus one chunk) whatever it claims. URLs are off unless the operator names
hosts (HEADWISE_IMAGE_URL_HOSTS): fetching a URL a client chose is a server-side request forgery
waiting to happen, so only listed hosts are fetched, redirects included, and only over http(s).

`read_image_ref` blocks (a download can take `timeout_s`); the caller runs it in a thread.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import IO

from service.images.errors import ImageError, byte_size

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
DATA_URI = re.compile(r"^data:(?P<type>[^;,]*)(?P<params>(;[^;,]*)*),", re.IGNORECASE)
NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/_-]")  # after trailing "=" are stripped
WHITESPACE = re.compile(r"\s+")
URL_SAFE = str.maketrans("-_", "+/")


@dataclass(frozen=True)
class FetchPolicy:
    """What a reference may cost: the bytes of the file, and for URLs which hosts (names as the
    URL spells them, any port; empty: no URL is ever fetched), how long, how many redirects."""

    allowed_hosts: frozenset[str] = frozenset()
    max_bytes: int = 20 * 2**20
    timeout_s: float = 10.0
    max_redirects: int = 3

    def __post_init__(self) -> None:
        # Host names are case-insensitive; urlsplit().hostname is lower-case.
        object.__setattr__(self, "allowed_hosts", frozenset(h.lower() for h in self.allowed_hosts))


def read_image_ref(ref: str, policy: FetchPolicy) -> bytes:
    """The bytes a reference names; `ImageError` (400, 413 or 422) when it cannot give them."""
    ref = ref.strip()
    if not ref:
        raise ImageError("image reference is empty")
    if ref[:5].lower() == "data:":
        return read_data_uri(ref, policy.max_bytes)
    if SCHEME.match(ref):
        return fetch(ref, policy)
    return decode_base64(ref, policy.max_bytes, "image is neither a data URI, an http(s) URL nor")


def read_data_uri(ref: str, max_bytes: int) -> bytes:
    """The payload of `data:image/...;base64,...`."""
    head = DATA_URI.match(ref)
    if head is None:
        raise ImageError("data URI has no ',' before its data")
    media_type = head["type"].strip().lower()
    if not media_type.startswith("image/"):
        raise ImageError(f"data URI media type {media_type or '(none)'!r} is not image/*")
    if "base64" not in (p.strip().lower() for p in head["params"].split(";")):
        raise ImageError("data URI must be base64 (data:image/...;base64,...)")
    return decode_base64(ref[head.end() :], max_bytes, "data URI data is not")


def decode_base64(text: str, max_bytes: int, not_base64: str = "not") -> bytes:
    """Standard or URL-safe base64, padding optional, whitespace ignored; refused by length
    before decoding when the result would be over `max_bytes`. `not_base64` begins the message
    for text that is not base64 ("... base64 (found '!' in it)")."""
    text = WHITESPACE.sub("", text).rstrip("=")
    size = len(text) * 3 // 4
    if size > max_bytes:
        raise ImageError(
            f"base64 image is {byte_size(size)}, over the {byte_size(max_bytes)} limit", 413
        )
    if bad := NOT_BASE64.search(text):
        raise ImageError(f"{not_base64} base64 (found {bad.group()!r} in it)")
    if len(text) % 4 == 1:
        raise ImageError("base64 image is cut short (its length is not possible in base64)")
    padded = text.translate(URL_SAFE) + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except binascii.Error as e:
        raise ImageError(f"base64 image is malformed: {e}") from None


def fetch(url: str, policy: FetchPolicy) -> bytes:
    """The body of an http(s) URL on an allowed host, at most `max_bytes`, within `timeout_s`."""
    check_url(url, policy)
    opener = urllib.request.build_opener(PolicyRedirects(policy))
    request = urllib.request.Request(url, headers={"User-Agent": "headwise"})
    deadline = time.monotonic() + policy.timeout_s
    try:
        with opener.open(request, timeout=policy.timeout_s) as response:
            return read_limited(response, policy.max_bytes, deadline, url)
    except ImageError:
        raise
    except urllib.error.HTTPError as e:
        raise ImageError(f"image URL {url} answered HTTP {e.code}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError is an OSError
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, TimeoutError):
            reason = f"no answer within {policy.timeout_s:g} s"
        raise ImageError(f"image URL {url} could not be fetched: {reason}") from None


def check_url(url: str, policy: FetchPolicy) -> None:
    """Refuse (400) a URL that is not http(s) or whose host the operator has not listed."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError as e:  # an unclosed "[" of an IPv6 literal, for one
        raise ImageError(f"image URL is malformed: {e}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ImageError(f"image URL scheme {parts.scheme!r} is not allowed: only http(s)", 400)
    if not policy.allowed_hosts:
        raise ImageError(
            "image URLs are off: the operator allows hosts with HEADWISE_IMAGE_URL_HOSTS", 400
        )
    if host not in policy.allowed_hosts:
        raise ImageError(f"image URL host {host!r} is not in HEADWISE_IMAGE_URL_HOSTS", 400)


def read_limited(
    response: http.client.HTTPResponse, max_bytes: int, deadline: float, url: str
) -> bytes:
    """The body in chunks, stopping (413) past `max_bytes` and (422) past the deadline: the
    socket timeout bounds each read, not a server that trickles bytes."""
    length = response.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ImageError(
            f"image URL body is {byte_size(int(length))}, over the {byte_size(max_bytes)} limit",
            413,
        )
    chunks: list[bytes] = []
    total = 0
    while chunk := response.read(CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise ImageError(f"image URL body is over the {byte_size(max_bytes)} limit", 413)
        if time.monotonic() > deadline:
            raise ImageError(f"image URL {url} took longer than its time limit to send")
        chunks.append(chunk)
    return b"".join(chunks)


class PolicyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed http(s) host, and only `max_redirects` times."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self.hops = 0  # one handler per fetch

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        self.hops += 1
        if self.hops > self.policy.max_redirects:
            raise ImageError(
                f"image URL {req.full_url} redirected more than {self.policy.max_redirects} times"
            )
        try:
            check_url(newurl, self.policy)
        except ImageError as e:
            log.info("image URL %s redirected to a refused URL %s", req.full_url, newurl)
            raise ImageError(f"image URL redirected elsewhere: {e.message}", 400) from None
        return super().redirect_request(req, fp, code, msg, headers, newurl)
