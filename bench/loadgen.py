"""A lean HTTP/1.1 load generator on raw asyncio streams: keep-alive connections, pre-built
requests, minimal parsing, so that the client takes little of the CPU the server needs."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
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


def build_requests(
    url: str, path: str, texts: list[str], openai: bool = False, per_request: int = 1
) -> list[bytes]:
    """One request per text, or per `per_request` consecutive texts (sent as a list)."""
    host = urlsplit(url).netloc
    out = []
    groups = (
        texts
        if per_request == 1
        else [
            [texts[(i + k) % len(texts)] for k in range(per_request)]
            for i in range(0, len(texts), per_request)
        ]
    )
    for text in groups:
        payload = (
            {"input": text, "model": "m", "encoding_format": "base64"}
            if openai
            else {"inputs": text}
        )
        body = orjson.dumps(payload)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        out.append(head + body)
    return out


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
