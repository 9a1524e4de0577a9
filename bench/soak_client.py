"""The soak's HTTP client: one keep-alive connection per loop, raw asyncio streams (cheap on
a shared CPU), and a recorder of (phase, endpoint, status, seconds) per request."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import defaultdict
from urllib.parse import urlsplit

import orjson

from bench.corpus import sentences

_WORDS: list[str] = []


def words() -> list[str]:
    if not _WORDS:
        _WORDS.extend(w.strip(".,;:!?\"'()").lower() for s in sentences(512) for w in s.split())
        _WORDS[:] = [w for w in _WORDS if w.isalpha()]
    return _WORDS


def text_of(rng: random.Random, n_words: int) -> str:
    """About n_words tokens of real words (most are one token each)."""
    vocab = words()
    return " ".join(rng.choice(vocab) for _ in range(n_words))


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """Small values common, large ones rare, as in real traffic: uniform in log."""
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def encode_body(rng: random.Random, n: int) -> dict:
    return {"inputs": [text_of(rng, log_uniform(rng, 1, 400)) for _ in range(n)]}


class Conn:
    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.host = host
        self.reader = reader
        self.writer = writer
        self.last_body = b""

    @classmethod
    async def open(cls, url: str) -> Conn:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=2**24)
        return cls(parts.netloc, reader, writer)

    async def send(self, path: str, body: dict | None = None) -> None:
        method = "GET" if body is None else "POST"
        data = b"" if body is None else orjson.dumps(body)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: keep-alive\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + data)
        await self.writer.drain()

    async def _answer(self, keep: bool) -> tuple[int, int]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length) if length else b""
        self.last_body = body if keep or status >= 400 else b""
        return status, length

    async def post(self, path: str, body: dict, keep: bool = False) -> tuple[int, int, float]:
        t0 = time.perf_counter()
        await self.send(path, body)
        status, size = await self._answer(keep)
        return status, size, time.perf_counter() - t0

    async def get(self, path: str) -> tuple[int, int, float]:
        t0 = time.perf_counter()
        await self.send(path)
        status, size = await self._answer(False)
        return status, size, time.perf_counter() - t0

    def close(self) -> None:
        self.writer.close()


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[float, str, str, int, float, int, int]] = []

    def add(self, phase: str, endpoint: str, status: int, seconds: float, texts: int = 0,
            nbytes: int = 0) -> None:
        self.rows.append((time.monotonic(), phase, endpoint, status, seconds, texts, nbytes))

    def texts(self, phase: str, endpoint: str) -> int:
        return sum(r[5] for r in self.rows if r[1] == phase and r[2] == endpoint and r[3] == 200)

    def series(self, t0: float) -> dict[str, list[tuple[float, float]]]:
        """Per endpoint, (seconds since t0, latency) of every answered request."""
        out: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for at, _, endpoint, _status, seconds, *_ in self.rows:
            if endpoint != "disconnect":
                out[endpoint].append((at - t0, seconds))
        return dict(out)

    def statuses(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for _, _, endpoint, status, *_ in self.rows:
            out[endpoint][str(status)] += 1
        return {k: dict(v) for k, v in out.items()}

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per phase and endpoint: count, texts/s, p50/p95/p99 ms of the 200s."""
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for row in self.rows:
            groups[(row[1], row[2])].append(row)
        out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
        for (phase, endpoint), rows in groups.items():
            ok = sorted(r[4] for r in rows if r[3] == 200)
            span = max(r[0] for r in rows) - min(r[0] - r[4] for r in rows)
            pct = {f"p{p}_ms": ok[min(len(ok) - 1, int(p / 100 * len(ok)))] * 1e3 if ok else None
                   for p in (50, 95, 99)}
            out[phase][endpoint] = {
                "count": len(rows),
                "ok": len(ok),
                "texts_per_s": sum(r[5] for r in rows if r[3] == 200) / span if span else 0.0,
                **pct,
            }
        return dict(out)
