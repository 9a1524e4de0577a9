"""Image references to bytes: data URIs, bare base64, and URLs fetched only from allowed hosts,
against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service.images import FetchPolicy, ImageError, read_image_ref
from service.images import source as source_module
from tests.service.images.samples import encode, noise

PNG = encode(noise(40, 30), "PNG")
BINARY = bytes(range(256)) * 4  # every base64 character, "+" and "/" included
POLICY = FetchPolicy()


def refused(ref: str, policy: FetchPolicy = POLICY) -> ImageError:
    with pytest.raises(ImageError) as caught:
        read_image_ref(ref, policy)
    return caught.value


# Data URIs and base64


def test_a_data_uri():
    ref = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert read_image_ref(ref, POLICY) == PNG


def test_a_data_uri_in_capitals_with_parameters_and_any_image_type():
    ref = "DATA:Image/WebP;name=x.webp;BASE64," + base64.b64encode(BINARY).decode()
    assert read_image_ref(ref, POLICY) == BINARY


@pytest.mark.parametrize(
    "ref, problem",
    [
        ("data:text/plain;base64,aGVsbG8=", "'text/plain' is not image/*"),
        ("data:;base64,aGVsbG8=", "'(none)' is not image/*"),
        ("data:image/png,%89PNG", "must be base64"),
        ("data:image/png;base64", "no ','"),
    ],
)
def test_a_data_uri_that_is_not_a_base64_image(ref, problem):
    err = refused(ref)
    assert err.status == 422 and problem in err.message


def test_bare_base64_in_either_alphabet_with_or_without_padding():
    standard = base64.b64encode(BINARY[:-2]).decode()
    url_safe = base64.urlsafe_b64encode(BINARY[:-2]).decode()
    assert "+" in standard and "-" in url_safe and standard.endswith("=")
    for ref in (standard, url_safe, standard.rstrip("="), url_safe.rstrip("=")):
        assert read_image_ref(ref, POLICY) == BINARY[:-2]


def test_whitespace_and_newlines_in_base64_are_ignored():
    wrapped = base64.encodebytes(PNG).decode()  # a newline every 76 characters
    assert "\n" in wrapped
    assert read_image_ref("  " + wrapped.replace("\n", "\r\n ") + "\n", POLICY) == PNG


@pytest.mark.parametrize(
    "ref, problem",
    [
        ("not base64!", "found '!'"),
        ("aGVs*bG8=", "found '*'"),
        ("aGVsbG8\u00e9", "found 'é'"),
        ("aGVs=bG8=", "found '='"),
        ("aGVsb", "cut short"),
        ("", "empty"),
    ],
)
def test_malformed_base64_is_422(ref, problem):
    err = refused(ref)
    assert err.status == 422 and problem in err.message


def test_the_message_says_what_the_reference_was_taken_for():
    assert refused("cat.png!").message == (
        "image is neither a data URI, an http(s) URL nor base64 (found '.' in it)"
    )
    assert refused("data:image/png;base64,iVBO!").message == (
        "data URI data is not base64 (found '!' in it)"
    )


def test_base64_over_the_limit_is_refused_before_it_is_decoded(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(source_module.base64, "b64decode", never)
    err = refused("A" * 4 * 1024, FetchPolicy(max_bytes=3 * 1024 - 1))
    assert err.status == 413
    assert err.message == "base64 image is 3072 bytes, over the 3071 bytes limit"
    err = refused("data:image/png;base64," + "A" * (28 * 2**20))
    assert err.status == 413 and "21 MB, over the 20 MB limit" in err.message


# URLs


def test_urls_are_off_unless_the_operator_allows_hosts():
    err = refused("https://example.com/cat.png")
    assert err.status == 400
    assert err.message == (
        "image URLs are off: the operator allows hosts with HEADWISE_IMAGE_URL_HOSTS"
    )


@pytest.mark.parametrize(
    "url, problem",
    [
        ("https://other.example/cat.png", "'other.example' is not in"),
        ("https://images.example@other.example/cat.png", "'other.example' is not in"),
        ("ftp://images.example/cat.png", "scheme 'ftp' is not allowed"),
        ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ],
)
def test_only_http_urls_on_allowed_hosts(url, problem):
    err = refused(url, FetchPolicy(allowed_hosts=frozenset({"IMAGES.example"})))
    assert err.status == 400 and problem in err.message


class Routes(BaseHTTPRequestHandler):
    """/image.png, /big (says its length), /stream (does not), /missing, /slow (answers when the
    test releases it), /to-image and /to-elsewhere (redirects), /loop (redirects to itself)."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.release.wait(30)
        if self.path in ("/image.png", "/slow"):
            self.answer(200, PNG)
        elif self.path == "/big":
            self.answer(200, bytes(5000))
        elif self.path == "/stream":
            self.send_response(200)
            self.end_headers()  # no Content-Length: the body runs until the connection closes
            for _ in range(10):
                self.wfile.write(bytes(1000))
            self.close_connection = True
        elif self.path in ("/to-image", "/to-elsewhere", "/loop"):
            target = {"/to-image": "/image.png", "/to-elsewhere": "http://other.example/x"}
            self.send_response(302)
            self.send_header("Location", target.get(self.path, "/loop"))
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.answer(404, b"no")

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Routes)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    Routes.release.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """urllib honours the environment's proxies; the local server is reached directly."""
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


LOCAL = FetchPolicy(allowed_hosts=frozenset({"127.0.0.1"}), max_bytes=4096, timeout_s=5)


def test_a_url_on_an_allowed_host_is_fetched(server):
    assert read_image_ref(f"{server}/image.png", LOCAL) == PNG


def test_a_redirect_within_the_allowed_hosts_is_followed(server):
    assert read_image_ref(f"{server}/to-image", LOCAL) == PNG


def test_a_redirect_to_a_host_not_allowed_is_refused(server):
    err = refused(f"{server}/to-elsewhere", LOCAL)
    assert err.status == 400 and "redirected elsewhere" in err.message
    assert "'other.example' is not in" in err.message


def test_redirects_are_counted(server):
    err = refused(f"{server}/loop", LOCAL)
    assert err.status == 422 and "redirected more than 3 times" in err.message


@pytest.mark.parametrize("path", ["/big", "/stream"])
def test_a_body_over_max_bytes_is_413_whether_or_not_it_says_its_length(server, path):
    err = refused(f"{server}{path}", LOCAL)
    assert err.status == 413 and "over the 4096 bytes limit" in err.message


def test_an_http_error_is_422_naming_the_status(server):
    err = refused(f"{server}/missing", LOCAL)
    assert err.status == 422 and "answered HTTP 404" in err.message


def test_a_server_that_does_not_answer_times_out(server):
    slow = FetchPolicy(allowed_hosts=frozenset({"127.0.0.1"}), timeout_s=0.2)
    err = refused(f"{server}/slow", slow)
    assert err.status == 422 and "no answer within 0.2 s" in err.message


def test_a_refused_connection_is_422():
    err = refused("http://127.0.0.1:9/x.png", LOCAL)  # the discard port: nothing listens
    assert err.status == 422 and "could not be fetched" in err.message
