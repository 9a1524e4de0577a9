"""python -m bench.soak --bundle B: a soak you can rerun (`make soak`; SOAK_SECONDS=600).

Starts `headwise serve` on 127.0.0.1 and drives it with bounded loops of mixed traffic:
/encode with 1-64 inputs of 1-400 words (log-uniform: small common, large rare), /v1/embeddings (base64), clients that disconnect
mid-request, and a /health probe; first without, then with two clients looping full-size
/attention (all layers and heads, JSON). Then one 2,048 x 200-token /encode, the /attention
answer's bytes and time as JSON and compact, and a minute idle. RSS (and its high-water mark)
is sampled every second from /proc. Before, the memory choice's speed cost: the same /encode
load against a server with the arena kept (HEADWISE_MEMORY=arena) and with the default.
Writes JSON, a markdown summary and a PNG of the RSS and latency curves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

from bench.server import get, launch, stop
from bench.soak_client import Conn, Recorder, encode_body, log_uniform, text_of
from service.engine.memory import process_rss_bytes

log = logging.getLogger("soak")


def proc_memory(pid: int) -> tuple[float, float]:
    """(RSS, high-water mark) in MB, from /proc."""
    rss, high = process_rss_bytes(pid)
    return rss / 2**20, high / 2**20


async def sampler(pid: int, out: list, t0: float, stop_at: asyncio.Event) -> None:
    while not stop_at.is_set():
        rss, hwm = proc_memory(pid)
        out.append((time.monotonic() - t0, rss, hwm))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_at.wait(), 1.0)


async def encode_client(url, rec, phase, until, rng, openai=False) -> None:
    conn = await Conn.open(url)
    try:
        while time.monotonic() < until:
            if openai:
                n = log_uniform(rng, 1, 16)
                body = {"input": [text_of(rng, log_uniform(rng, 1, 400)) for _ in range(n)],
                        "model": "m", "encoding_format": "base64"}
                path = "/v1/embeddings"
            else:
                n = log_uniform(rng, 1, 64)
                body, path = encode_body(rng, n), "/encode"
            status, _, seconds = await conn.post(path, body)
            rec.add(phase, path, status, seconds, texts=n)
    finally:
        conn.close()


async def disconnecting_client(url, rec, phase, until, rng) -> None:
    """Sends a large /encode and goes away before the answer."""
    while time.monotonic() < until:
        conn = await Conn.open(url)
        await conn.send("/encode", encode_body(rng, 64))
        await asyncio.sleep(rng.uniform(0.01, 0.3))  # a client giving up, not a sync point
        conn.close()
        rec.add(phase, "disconnect", 499, 0.0)
        await asyncio.sleep(0.5)


async def attention_client(url, rec, phase, until, rng) -> None:
    conn = await Conn.open(url)
    try:
        while time.monotonic() < until:
            body = {"input": text_of(rng, 300), "truncate": True}
            status, size, seconds = await conn.post("/attention", body)
            rec.add(phase, "/attention", status, seconds, nbytes=size)
            if status == 429:
                await asyncio.sleep(1.0)  # Retry-After
    finally:
        conn.close()


async def health_probe(url, rec, phase, until) -> None:
    conn = await Conn.open(url)
    try:
        while time.monotonic() < until:
            status, _, seconds = await conn.get("/health")
            rec.add(phase, "/health", status, seconds)
            await asyncio.sleep(0.1)  # 10 probes a second
    finally:
        conn.close()


async def phase(url, rec, name, seconds, attention: int, seed: int) -> None:
    until = time.monotonic() + seconds
    rng = random.Random(seed)  # the same requests in every phase with this seed
    tasks = [encode_client(url, rec, name, until, random.Random(rng.random())) for _ in range(4)]
    tasks.append(encode_client(url, rec, name, until, random.Random(rng.random()), openai=True))
    tasks.append(disconnecting_client(url, rec, name, until, random.Random(rng.random())))
    tasks.append(health_probe(url, rec, name, until))
    tasks += [attention_client(url, rec, name, until, random.Random(i)) for i in range(attention)]
    await asyncio.gather(*tasks)


async def encode_2048(url: str) -> dict:
    rng = random.Random(7)
    conn = await Conn.open(url)
    try:
        body = {"inputs": [text_of(rng, 200) for _ in range(2048)]}
        status, _, seconds = await conn.post("/encode", body, keep=True)
        message = conn.last_body[:400].decode(errors="replace")
        return {"status": status, "seconds": seconds, "message": message}
    finally:
        conn.close()


async def attention_sizes(bundle: Path) -> dict:
    """One full-size /attention answer as JSON and compact: bytes and time, on a server of its
    own with no CPU share (the soak server's pacing would be measured instead)."""
    proc, url = launch(bundle, {"HEADWISE_ATTENTION_CPU_SHARE": "1"})
    out = {}
    conn = await Conn.open(url)
    try:
        text = text_of(random.Random(7), 300)
        for encoding in ("float", "base64_f16", "base64_f32"):
            body = {"input": text, "truncate": True, "encoding_format": encoding}
            runs = []
            for _ in range(3):
                status, size, seconds = await conn.post("/attention", body)
                runs.append(seconds)
            out[encoding] = {"status": status, "bytes": size, "seconds": min(runs)}
    finally:
        conn.close()
        stop(proc)
    return out


def queue_depth(url: str) -> float:
    total = 0.0
    for line in get(f"{url}/metrics").decode().splitlines():
        if line.startswith("headwise_queue_depth{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def speed_cost(bundle: Path, seconds: float) -> dict:
    """/encode texts/s with the arena kept vs the default memory choice, same load, same run."""
    out: dict[str, list[float]] = {"arena": [], "default": []}
    for _ in range(2):  # interleaved, so a busy neighbour hits both alike
        for name, env in (("default", {}), ("arena", {"HEADWISE_MEMORY": "arena"})):
            proc, url = launch(bundle, {"HEADWISE_ATTENTION_ENABLED": "false", **env})
            try:
                rec = Recorder()
                until = time.monotonic() + seconds
                rng = random.Random(1)
                await asyncio.gather(*(encode_client(url, rec, "x", until, random.Random(rng.random()))
                                       for _ in range(4)))
                out[name].append(rec.texts("x", "/encode") / seconds)
            finally:
                stop(proc)
    best = {k: max(v) for k, v in out.items()}
    return {"texts_per_s": out, "ratio_default_vs_arena": best["default"] / best["arena"]}


async def soak(args) -> dict:
    results: dict = {"seconds": args.seconds, "cpus": os.cpu_count(), "load": os.getloadavg()}
    log.info("memory choice's speed cost (%.0f s per server, twice each) …", args.bench_seconds)
    results["speed_cost"] = await speed_cost(args.bundle, args.bench_seconds)
    proc, url = launch(args.bundle)
    samples: list = []
    rec = Recorder()
    stop_at = asyncio.Event()
    t0 = time.monotonic()
    sampling = asyncio.create_task(sampler(proc.pid, samples, t0, stop_at))
    marks = {}
    try:
        info = json.loads(get(f"{url}/info"))
        results["memory_bound_mb"] = info["memory"]["bound_bytes"] / 2**20
        results["memory"] = info["memory"]
        await phase(url, rec, "warmup", min(20.0, args.seconds * 0.05), 0, 99)
        results["rss_warm_mb"] = proc_memory(proc.pid)[0]
        marks["warm"] = time.monotonic() - t0
        half = args.seconds * 0.45
        log.info("phase A: mixed traffic, no /attention (%.0f s) …", half)
        await phase(url, rec, "no_attention", half, 0, 1)
        marks["attention"] = time.monotonic() - t0
        log.info("phase B: the same with two /attention loops (%.0f s) …", half)
        await phase(url, rec, "attention", half, 2, 1)
        marks["one_offs"] = time.monotonic() - t0
        log.info("2048 x 200 tokens …")
        results["encode_2048x200"] = await encode_2048(url)
        left = time.monotonic()
        depth_zero_s = None
        while time.monotonic() - left < 5:
            if queue_depth(url) == 0:
                depth_zero_s = time.monotonic() - left
                break
        results["queue_depth_zero_after_s"] = depth_zero_s
        marks["idle"] = time.monotonic() - t0
        log.info("idle %.0f s …", args.idle)
        await asyncio.sleep(args.idle)  # the idle period being measured
        results["rss_after_idle_mb"] = proc_memory(proc.pid)[0]
        results["metrics_peak_mb"] = _metric(url, "headwise_process_resident_memory_peak_bytes")
    finally:
        stop_at.set()
        await sampling
        stop(proc)
    log.info("/attention JSON vs compact …")
    results["attention_sizes"] = await attention_sizes(args.bundle)
    results["rss_start_mb"] = samples[0][1]
    results["rss_peak_mb"] = max(s[2] for s in samples)
    results["marks"] = marks
    results["samples"] = samples
    results["idle_s"] = args.idle
    results["latency"] = rec.summary()
    results["latency_series"] = rec.series(t0)
    results["statuses"] = rec.statuses()
    return results


def _metric(url: str, name: str) -> float:
    for line in get(f"{url}/metrics").decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1]) / 2**20
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    p.add_argument("--idle", type=float, default=float(os.environ.get("SOAK_IDLE_SECONDS", 60)))
    p.add_argument("--bench-seconds", type=float, default=None)
    p.add_argument("--out", type=Path, default=Path("bench/results/soak"))
    args = p.parse_args(argv)
    args.bench_seconds = args.bench_seconds or max(10.0, args.seconds * 0.03)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = asyncio.run(soak(args))
    from bench.soak_report import plot, render

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "soak.png")
    summary = render(results)
    (args.out / "soak.md").write_text(summary + "\n")
    print(summary)  # noqa: T201 - the summary is the program's output
    log.info("wrote %s/soak.{json,md,png}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
