"""Connections that cannot lock anyone out (service/http/protocol.py), driven with real sockets
against a real uvicorn server in this process (fake backends: a test holds a batch)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from bench.server import free_port
from service.http.app import create_app
from service.http.protocol import Coalescing, Limits, guarded
from service.settings import Settings
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest
from tests.waiting import until


@dataclass
class Running:
    url: str
    port: int
    backend: FakeBackend
    server: uvicorn.Server


@contextlib.contextmanager
def running(limits: Limits, **settings: object) -> Iterator[Running]:
    backend = FakeBackend(fake_manifest("fake"))
    port = free_port()
    app = create_app(Settings(bundle=Path("fake"), port=port, **settings), loader=fake_loader(backend))
    limits = Limits(**{**limits.__dict__, "always": app.state.table.liveness()})
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=guarded(limits), log_level="warning", timeout_keep_alive=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        until(lambda: server.started, "the server to start")
        url = f"http://127.0.0.1:{port}"
        until(lambda: httpx.get(f"{url}/ready", timeout=5).status_code == 200, "ready")
        yield Running(url, port, backend, server)
    finally:
        backend.release.set()
        server.should_exit = True
        thread.join(20)


def closed_by_server(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (fails if it never does)."""
    sock.settimeout(timeout_s)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def raise_own_open_files(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def test_a_socket_that_never_sends_is_closed_at_the_header_deadline():
    with (
        running(Limits(header_timeout_s=0.3)) as srv,
        socket.create_connection(("127.0.0.1", srv.port)) as s,
    ):
        assert closed_by_server(s) == b""  # nothing was asked, nothing is answered


def test_trickled_headers_get_408_and_a_closed_connection():
    with running(Limits(header_timeout_s=0.5)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            for _ in range(3):  # slowloris: a header byte now and then, never the end
                s.sendall(b"X-a: b\r\n")
                time.sleep(0.05)
            answer = closed_by_server(s)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer


def test_headers_over_the_limit_are_431_before_the_parser_holds_them():
    with running(Limits(max_header_bytes=4096)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * 8192)
            answer = closed_by_server(s)
        assert answer.startswith(b"HTTP/1.1 431") and b"4096 bytes" in answer
        assert httpx.get(f"{srv.url}/health").status_code == 200


def test_a_large_body_sharing_the_headers_read_is_not_mistaken_for_headers():
    with running(Limits(max_header_bytes=4096)) as srv:
        r = httpx.post(f"{srv.url}/encode", json={"inputs": ["the cat " * 2000]})
        assert r.status_code == 200


@pytest.mark.slow
def test_a_response_head_and_body_arrive_in_one_read(tiny_bundle, tmp_path):
    """uvicorn writes a response's head and body apart; the client's first read must find both
    (two segments on a no-delay socket wake the client for a head without its body). The
    server in its own process: one in this one would hold the GIL between the two writes."""
    from tests.live import serve

    request = b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    body = b'{"inputs": ["the cat"]}'
    request += b"Content-Length: %d\r\n\r\n" % len(body) + body
    with serve(tiny_bundle, tmp_path) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.settimeout(10)
            for _ in range(100):  # kept alive: each answer read with one recv as it first arrives
                sock.sendall(request)
                first = sock.recv(1 << 20)
                head, _, got = first.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), first[:200]
                length = next(
                    int(line.split(b":")[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )  # fmt: skip
                assert len(got) == length > 0, (len(got), length)


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_of_one_loop_turn_leave_together_and_closing_sends_what_is_held():
    async def main() -> list[list[bytes]]:
        seen = []
        t = Transport()
        c = Coalescing(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        c.write(b"head")
        c.write(b"body")  # the second write sends both at once
        seen.append(list(t.writes))
        c.write(b"alone")
        seen.append(list(t.writes))  # held ...
        await asyncio.sleep(0)
        seen.append(list(t.writes))  # ... until the loop's turn ends
        c.write(b"last")
        c.close()  # sent before the close
        seen.append(list(t.writes))
        assert t.closed and c.is_closing() and c.get_extra_info("peername") == "info:peername"
        c.write(b"late")
        await asyncio.sleep(0)  # written after the close: dropped, as the transport would
        seen.append(list(t.writes))
        t = Transport()
        c = Coalescing(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        large = b"x" * (Coalescing.JOIN_BYTES + 1)
        c.write(b"head")
        c.write(large)  # a large body goes as it is, after the head, not copied to join it
        assert t.writes == [b"head", large] and t.writes[1] is large
        return seen

    seen = asyncio.run(main())
    assert seen[0] == [b"headbody"]
    assert seen[1] == [b"headbody"]
    assert seen[2] == [b"headbody", b"alone"]
    assert seen[3] == seen[4] == [b"headbody", b"alone", b"last"]


def test_idle_connections_do_not_count_against_the_request_limit():
    with running(Limits(max_requests=2)) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        try:
            assert httpx.get(f"{srv.url}/health").status_code == 200
            assert httpx.post(f"{srv.url}/encode", json={"inputs": "the cat"}).status_code == 200
        finally:
            for s in idle:
                s.close()


def test_past_the_connection_bound_the_longest_idle_connection_is_closed():
    with running(Limits(max_connections=16)) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(16)]
        try:
            until(lambda: len(srv.server.server_state.connections) == 16, "16 connections")
            with httpx.Client() as c:  # one more: the oldest idle one makes room
                assert c.post(f"{srv.url}/encode", json={"inputs": "the cat"}).status_code == 200
            assert closed_by_server(idle[0], 5) == b""
        finally:
            for s in idle:
                s.close()


def test_over_the_request_limit_a_route_answers_503_in_its_dialect_and_health_still_200():
    with running(Limits(max_requests=1)) as srv:
        srv.backend.release.clear()
        srv.backend.entered.clear()
        held = threading.Thread(
            target=lambda: httpx.post(f"{srv.url}/encode", json={"inputs": "x"}, timeout=30)
        )
        held.start()
        try:
            assert srv.backend.entered.wait(10)
            r = httpx.post(f"{srv.url}/embed", json={"inputs": "the cat"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert set(r.json()) == {"error", "error_type"}  # TEI's shape on TEI's route
            assert "requests in flight" in r.json()["error"]
            assert httpx.get(f"{srv.url}/health").status_code == 200
        finally:
            srv.backend.release.set()
            held.join(20)


@pytest.mark.slow
def test_a_thousand_idle_sockets_and_two_hundred_slowloris_lock_nobody_out():
    raise_own_open_files(4096)
    limits = Limits(header_timeout_s=3.0)
    with running(limits) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(1000)]
        loris = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(200)]
        try:
            for s in loris:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            with httpx.Client(timeout=10) as c:
                statuses = [c.get(f"{srv.url}/health").status_code for _ in range(50)]
                encoded = [c.post(f"{srv.url}/encode", json={"inputs": "x"}).status_code for _ in range(10)]
            assert statuses == [200] * 50 and encoded == [200] * 10
            # And they are all closed within the header deadline (with room for the loop).
            until(
                lambda: len(srv.server.server_state.connections) <= 2,
                "the idle and slowloris sockets to be closed",
                timeout_s=limits.header_timeout_s + 10,
            )
        finally:
            for s in idle + loris:
                s.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_256_mb_header_is_refused_and_the_memory_stays_where_it_was(tiny_bundle, tmp_path):
    from tests.live import serve

    with serve(tiny_bundle, tmp_path) as server:
        host, port = server.url.removeprefix("http://").split(":")
        before = rss_mb(server.process.pid)
        answer = b""
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-huge: ")
            chunk = b"a" * (1 << 20)
            try:
                for _ in range(256):
                    s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed long before the 256 MB were sent
            with contextlib.suppress(ConnectionResetError):
                answer = closed_by_server(s)
        after = rss_mb(server.process.pid)
        assert httpx.get(f"{server.url}/health").status_code == 200
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431")
    assert after <= before * 1.1, (before, after)
