"""A lean HTTP/1.1 load generator on raw asyncio streams: keep-alive connections, pre-built
requests, minimal parsing, so that the client takes little of the CPU the server needs."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    latencies: list[float] = field(repr=False)
    statuses: dict[int, int]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def percentile(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


@dataclass
class Answer:
    """A whole response: status, headers (names in lower case) and body."""

    status_code: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def build_request(url: str, path: str, payload: Any) -> bytes:
    """One keep-alive JSON POST, ready for the wire."""
    body = orjson.dumps(payload)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()
    return head + body


def build_requests(
    url: str, path: str, texts: list[str], openai: bool = False, per_request: int = 1
) -> list[bytes]:
    """One request per text, or per `per_request` consecutive texts (sent as a list)."""
    groups = (
        texts
        if per_request == 1
        else [
            [texts[(i + k) % len(texts)] for k in range(per_request)]
            for i in range(0, len(texts), per_request)
        ]
    )
    return [
        build_request(
            url,
            path,
            {"input": text, "model": "m", "encoding_format": "base64"}
            if openai
            else {"inputs": text},
        )
        for text in groups
    ]


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def run_load(url: str, requests: list[bytes], concurrency: int, total: int) -> LoadResult:
    """`total` requests from `concurrency` connections, each one request at a time."""
    parts = urlsplit(url)
    counter = itertools.count()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            while (i := next(counter)) < total:
                t0 = time.perf_counter()
                writer.write(requests[i % len(requests)])
                try:
                    status = await _read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
                    continue
                latencies.append(time.perf_counter() - t0)
                statuses[status] = statuses.get(status, 0) + 1
                if status != 200:
                    errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(concurrency, total, errors, time.perf_counter() - t0, latencies, statuses)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = (line.partition(":") for line in lines[1:] if line)
    headers = {k.strip().lower(): v.strip() for k, _, v in fields}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return Answer(int(lines[0].split()[1]), headers, body)


async def answers(
    url: str, requests: list[bytes], concurrency: int
) -> list[tuple[Answer | Exception, float]]:
    """Every request once, from `concurrency` keep-alive connections (as many as requests: all
    on the wire at once), each answer parsed whole with its latency, or the transport error it
    met (its connection then ends; the others take the rest). Where a client must see each
    answer, not only count them (run_load), at a client's cost that does not pace the server:
    httpx's pool spent ~55 s of CPU on 3,000 requests at 300 connections."""
    parts = urlsplit(url)
    pending = iter(range(len(requests)))
    results: list[tuple[Answer | Exception, float]] = [
        (ConnectionError("never sent: every connection failed"), 0.0)
    ] * len(requests)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            for i in pending:
                t0 = time.perf_counter()
                try:
                    writer.write(requests[i])
                    answer = await read_answer(reader)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    results[i] = exc, time.perf_counter() - t0
                    return
                results[i] = answer, time.perf_counter() - t0
                if answer.headers.get("connection", "").lower() == "close":
                    writer.close()
                    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(min(concurrency, len(requests)))))
    return results
