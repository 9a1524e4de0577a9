"""python -m bench.hostile --bundle B: the server against hostile and impatient clients.

Three measurements, each against a fresh `headwise serve` process:

1. sockets: 1,000 sockets that never send a byte and 200 slowloris connections trickling header
   bytes are opened; meanwhile /health and /encode are timed (p50/p99), and the time until the
   server has closed every hostile socket is measured.
2. deadlines: a mixed load of big /encode and /rerank requests, offered at once at ~4x the work
   one request deadline can hold at the server's measured capacity: how many are refused at
   once (429/413), how many of the rest succeed, and the latest answer against the deadline.
3. gone clients: the server's CPU seconds for one 1,024-document rerank answered in full,
   against ten such requests sent at once whose clients leave after 100 ms.

The reranker is a random-weight BertForSequenceClassification of all-MiniLM-L6-v2's shape
(6 layers, 384 wide, its tokenizer), exported once to bundles/bench-ranker: the compute of a
real small cross-encoder. Writes bench/results/hostile.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.corpus import sentences
from bench.loadgen import Answer, answers, build_request
from bench.results_io import save
from bench.server import cpu_seconds, exported, launch, stop

log = logging.getLogger("hostile")
RESULTS = Path("bench/results")


def ranker_bundle(out: Path) -> Path:
    """A MiniLM-shaped random cross-encoder, exported by the CLI (once per bundle format)."""
    if exported(out):
        return out
    import torch
    import transformers

    from models.weights import default_model_dir

    src = default_model_dir()
    folder = out.parent / f"{out.name}-checkpoint"
    config = transformers.BertConfig.from_pretrained(src, num_labels=1)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    cmd = [sys.executable, "-m", "service.cli", "export", "--model", str(folder), "--out", str(out)]
    subprocess.run(cmd, check=True)
    return out


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{url}/metrics")).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# --- 1. sockets --------------------------------------------------------------------------


def room_for_sockets(n: int) -> None:
    """This process may hold `n` sockets more than its few hundred own (as far as the hard
    limit allows; never lowered)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 512), hard))


def sockets(bundle: Path, idle_n: int, loris_n: int, probes: int) -> dict[str, Any]:
    room_for_sockets(idle_n + loris_n)
    proc, url = launch(bundle)
    port = int(url.rsplit(":", 1)[1])
    try:
        opened = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle_n)]
        loris = [socket.create_connection(("127.0.0.1", port)) for _ in range(loris_n)]
        for s in loris:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        health, encode = [], []
        with httpx.Client(timeout=30) as c:
            for i in range(probes):
                for s in loris[i % 7 :: 7]:  # keep trickling
                    with contextlib.suppress(OSError):
                        s.sendall(b"X-a: b\r\n")
                t0 = time.monotonic()
                ok = c.get(f"{url}/health").status_code == 200
                health.append((time.monotonic() - t0) * 1e3 if ok else float("inf"))
                if i % 5 == 0:
                    t0 = time.monotonic()
                    ok = c.post(f"{url}/encode", json={"inputs": "a short text"}).status_code == 200
                    encode.append((time.monotonic() - t0) * 1e3 if ok else float("inf"))
        closed = []
        for s in idle + loris:
            s.settimeout(120)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
            closed.append(time.monotonic() - opened)
            s.close()
        return {
            "idle": idle_n,
            "slowloris": loris_n,
            "health_p50_ms": pct(health, 0.5),
            "health_p99_ms": pct(health, 0.99),
            "health_failed": sum(h == float("inf") for h in health),
            "encode_p50_ms": pct(encode, 0.5),
            "encode_failed": sum(e == float("inf") for e in encode),
            "all_closed_after_s": max(closed),
        }
    finally:
        stop(proc)


# --- 2. deadlines ------------------------------------------------------------------------


async def deadlines(bundles: list[str], timeout_s: float, load: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    texts = sentences()
    env = {"HEADWISE_REQUEST_TIMEOUT_S": str(timeout_s), "HEADWISE_MAX_QUEUE_TEXTS": "100000"}
    proc, url = launch(bundles, env)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s * 4) as c:
            # Warm both batchers so that admission works from measured rates.
            for _ in range(3):
                await c.post("/encode", json={"inputs": [rng.choice(texts) for _ in range(64)]})
                await c.post("/rerank", json={"query": "q", "texts": [rng.choice(texts) for _ in range(64)]})
        capacity = await metric(url, "headwise_capacity_tokens_per_second", path="encode")
        ranker = await metric(url, "headwise_capacity_tokens_per_second", path="rerank")
        budget = load * timeout_s * (capacity + ranker) / 2  # padded tokens offered
        requests: list[tuple[str, dict[str, Any]]] = []
        offered = 0.0
        while offered < budget:
            docs = [" ".join(rng.choice(texts) for _ in range(3)) for _ in range(128)]
            if len(requests) % 2:
                requests.append(("/encode", {"inputs": docs}))
            else:
                requests.append(("/rerank", {"query": rng.choice(texts), "texts": docs}))
            offered += 128 * 90  # about 90 tokens a document
        # Every request on the wire at once, each on its own connection, from raw streams:
        # httpx's pool (100 connections by default, and slow past hundreds) timed the client.
        wire = [build_request(url, path, body) for path, body in requests]
        room_for_sockets(len(wire))
        answered = await asyncio.wait_for(answers(url, wire, len(wire)), timeout_s * 20)
        results = [
            (path, a.status_code if isinstance(a, Answer) else 0, seconds, refusal(a))
            for (path, _), (a, seconds) in zip(requests, answered, strict=True)
        ]
    finally:
        stop(proc)
    refused = [r for r in results if r[3]]
    admitted = [r for r in results if not r[3]]
    ok = [r for r in admitted if r[1] == 200]
    return {
        "timeout_s": timeout_s,
        "capacity_tokens_per_s": {"encode": capacity, "rerank": ranker},
        "offered_x_one_deadline": load,
        "requests": len(results),
        "refused_at_once": len(refused),
        "refused_latest_s": max((r[2] for r in refused), default=0.0),
        "admitted": len(admitted),
        "admitted_ok": len(ok),
        "admitted_ok_share": len(ok) / len(admitted) if admitted else float("nan"),
        "statuses": {str(s): sum(r[1] == s for r in results) for s in sorted({r[1] for r in results})},
        "latest_answer_s": max(r[2] for r in results),
        "latest_answer_vs_deadline_s": max(r[2] for r in results) - timeout_s,
    }


def refusal(answer: Answer | Exception) -> bool:
    """Refused before any work: 413, 429, or the in-flight limit's 503 ("server at capacity",
    HEADWISE_MAX_REQUESTS, when more requests are offered than it allows); a 503 at the
    deadline is an admitted request that did not finish."""
    if not isinstance(answer, Answer):
        return False
    status = answer.status_code
    return status in (413, 429) or (status == 503 and b"server at capacity" in answer.body)


# --- 3. gone clients ---------------------------------------------------------------------


async def gone_clients(bundles: list[str], documents: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    texts = sentences()
    docs = [" ".join(rng.choice(texts) for _ in range(3)) for _ in range(documents)]
    body = json.dumps({"query": "how do I reset my password", "texts": docs}).encode()
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "600", "HEADWISE_RERANK_MAX_DOCUMENTS": str(documents)}
    proc, url = launch(bundles, env)
    host, port = url.removeprefix("http://").split(":")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            await c.post("/rerank", json={"query": "warm", "texts": docs[:64]})

            async def idle() -> None:
                while await metric(url, "headwise_inflight_requests") > 1 or await metric(
                    url, "headwise_queue_depth"
                ):
                    await asyncio.sleep(0.1)

            await idle()
            cpu0 = cpu_seconds(proc.pid)
            t0 = time.monotonic()
            r = await c.post("/rerank", content=body, headers={"content-type": "application/json"})
            full_s = time.monotonic() - t0
            assert r.status_code == 200, r.text[:200]
            await idle()
            full_cpu = cpu_seconds(proc.pid) - cpu0

            async def leave_after(delay: float) -> None:
                reader, writer = await asyncio.open_connection(host, int(port))
                head = (
                    f"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                writer.write(head + body)
                await writer.drain()
                await asyncio.sleep(delay)
                writer.close()

            cpu0 = cpu_seconds(proc.pid)
            await asyncio.gather(*(leave_after(0.1) for _ in range(10)))
            await idle()
            gone_cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        stop(proc)
    return {
        "documents": documents,
        "full_request_cpu_s": full_cpu,
        "full_request_wall_s": full_s,
        "ten_gone_cpu_s": gone_cpu,
        "ratio": gone_cpu / full_cpu,
    }


def report(out: dict[str, Any]) -> str:
    s, d, g = out["sockets"], out["deadlines"], out["gone"]
    lines = [
        f"headwise hostile clients · {out['cpus']} cores · {out['when']}",
        "",
        "| what | measured | goal |",
        "| --- | ---: | --- |",
        f"| /health p99 with {s['idle']} idle and {s['slowloris']} slowloris sockets open | "
        f"{s['health_p99_ms']:.1f} ms (p50 {s['health_p50_ms']:.1f}, {s['health_failed']} failed) | < 100 ms |",
        f"| /encode one short text meanwhile, p50 | {s['encode_p50_ms']:.1f} ms ({s['encode_failed']} failed) | answered |",
        f"| every hostile socket closed by the server after | {s['all_closed_after_s']:.1f} s | within the configured times |",
        f"| mixed /encode + /rerank at {d['offered_x_one_deadline']:g}x one deadline ({d['requests']} requests): refused at once | "
        f"{d['refused_at_once']} (latest refusal {d['refused_latest_s'] * 1e3:.0f} ms) | at once |",
        f"| of those admitted, answered 200 | {d['admitted_ok']} of {d['admitted']} "
        f"({100 * d['admitted_ok_share']:.1f} %) | >= 95 % |",
        f"| latest answer vs the deadline ({d['timeout_s']:g} s) | {d['latest_answer_vs_deadline_s']:+.2f} s | <= +2 s |",
        f"| ten {g['documents']}-document reranks whose clients leave after 100 ms, CPU vs one answered | "
        f"{g['ten_gone_cpu_s']:.2f} / {g['full_request_cpu_s']:.2f} s = {g['ratio']:.2f}x | < 0.5x |",
        "",
        f"statuses of the mixed load: {d['statuses']}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostile")
    p.add_argument("--bundle", type=Path, required=True, help="the embedder's bundle")
    p.add_argument("--ranker", type=Path, default=Path("bundles/bench-ranker"))
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--slowloris", type=int, default=200)
    p.add_argument("--probes", type=int, default=200)
    p.add_argument("--timeout", type=float, default=10.0, help="HEADWISE_REQUEST_TIMEOUT_S")
    p.add_argument("--load", type=float, default=4.0, help="offered work, x one deadline")
    p.add_argument("--documents", type=int, default=1024)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ranker = ranker_bundle(args.ranker)
    bundles = [str(args.bundle), f"ranker={ranker}"]
    out: dict[str, Any] = {"cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M")}
    log.info("sockets")
    out["sockets"] = sockets(args.bundle, args.idle, args.slowloris, args.probes)
    log.info("deadlines")
    out["deadlines"] = asyncio.run(deadlines(bundles, args.timeout, args.load, 0))
    log.info("gone clients")
    out["gone"] = asyncio.run(gone_clients(bundles, args.documents, 0))
    save(args.out, "hostile", out, report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
