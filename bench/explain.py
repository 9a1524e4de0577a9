"""python -m bench.explain --bundle B: what an explanation costs, and what it costs /encode.

Against a fresh `headwise serve` process on the bundle:

1. cost: one text of 32 and of 256 tokens (CPython's documentation, cut at the length), each
   sent alone, one request at a time: /explain (token granularity: n + 1 forward passes) against
   one /encode of the same text; wall time (median) and the server's own inference time
   (x-inference-time), and their ratios.
2. interference: /encode of a 128-token text from one interactive client (a request, then an
   exponential think time, so that its arrivals do not follow the explanations' rhythm), first
   on an idle server, then while two clients loop /explain on other 128-token texts; the p50,
   p90 and p99 of each, and the explanations answered meanwhile. Goal: the p50 within 2x.

Writes bench/results/explain.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from bench.corpus import sentences
from bench.results_io import save, vector_flags
from bench.server import launch, stop
from service.bundle import load_bundle

log = logging.getLogger("bench.explain")
RESULTS = Path("bench/results")


def cpu() -> dict[str, Any]:
    """The model name and the vector extensions ONNX Runtime can use (lscpu's flags)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = re.search(r"^model name\s*:\s*(.+)$", text, flags=re.M)
    return {"model": name.group(1) if name else platform.processor(), "cores": os.cpu_count(),
            "flags": vector_flags()}  # fmt: skip


def texts_of(tokenizer: Tokenizer, tokens: int, count: int, seed: int) -> list[str]:
    """`count` texts of exactly `tokens` tokens (special ones included) where the tokenizer
    allows: real sentences joined, cut at a token's end."""
    rng = random.Random(seed)
    pool = sentences()
    out = []
    while len(out) < count:
        text = " ".join(rng.sample(pool, 40))
        enc = tokenizer.encode(text, add_special_tokens=False)
        words = tokens - 2
        cut = text[: enc.offsets[words - 1][1]]
        if len(tokenizer.encode(cut).ids) == tokens:
            out.append(cut)
    return out


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def timed(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, float, Any]:
    """Wall seconds, the server's inference seconds, and the answer of one request (200)."""
    t0 = time.perf_counter()
    r = c.post(path, json=body)
    wall = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:300]}")
    return wall, float(r.headers.get("x-inference-time", "nan")) / 1e3, r.json()


def cost(url: str, text: str, runs: int, encodes: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=600) as c:
        for _ in range(3):
            timed(c, "/encode", {"inputs": text})
        encode = [timed(c, "/encode", {"inputs": text}) for _ in range(encodes)]
        body = {"input": text}
        timed(c, "/explain", body)  # warm
        explain = [timed(c, "/explain", body) for _ in range(runs)]
    parts = len(explain[0][2]["parts"][0])
    enc_wall = statistics.median(w for w, _, _ in encode)
    enc_infer = statistics.median(i for _, i, _ in encode)
    exp_wall = statistics.median(w for w, _, _ in explain)
    exp_infer = statistics.median(i for _, i, _ in explain)
    return {
        "passes": parts + 1,
        "encode_ms": enc_wall * 1e3,
        "encode_inference_ms": enc_infer * 1e3,
        "explain_ms": exp_wall * 1e3,
        "explain_inference_ms": exp_infer * 1e3,
        "wall_ratio": exp_wall / enc_wall,
        "inference_ratio": exp_infer / enc_infer,
        "explain_ms_per_pass": exp_wall * 1e3 / (parts + 1),
    }


async def encode_client(
    c: httpx.AsyncClient, text: str, seconds: float, think_s: float, seed: int
) -> tuple[list[float], int]:
    rng = random.Random(seed)
    latencies, failed = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = await c.post("/encode", json={"inputs": text})
        if r.status_code == 200:
            latencies.append(time.perf_counter() - t0)
        else:
            failed += 1
        await asyncio.sleep(rng.expovariate(1 / think_s))
    return latencies, failed


async def explain_client(
    c: httpx.AsyncClient, texts: list[str], stop_at: asyncio.Event, out: dict[str, Any]
) -> None:
    i = 0
    while not stop_at.is_set():
        t0 = time.perf_counter()
        r = await c.post("/explain", json={"input": texts[i % len(texts)]})
        out["statuses"][r.status_code] = out["statuses"].get(r.status_code, 0) + 1
        if r.status_code == 200:
            out["seconds"].append(time.perf_counter() - t0)
        i += 1


async def interference(
    url: str, text: str, others: list[str], seconds: float, think_s: float, clients: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        for _ in range(3):
            await c.post("/encode", json={"inputs": text})
        idle, idle_failed = await encode_client(c, text, seconds, think_s, 0)
        stop_at = asyncio.Event()
        explained: dict[str, Any] = {"statuses": {}, "seconds": []}
        loops = [
            asyncio.ensure_future(explain_client(c, others[k::clients], stop_at, explained))
            for k in range(clients)
        ]
        t0 = time.monotonic()
        busy, busy_failed = await encode_client(c, text, seconds, think_s, 1)
        stop_at.set()
        await asyncio.gather(*loops)  # each finishes the explanation it is waiting for
        elapsed = time.monotonic() - t0
    ms = [x * 1e3 for x in idle], [x * 1e3 for x in busy]
    return {
        "think_s": think_s,
        "explain_clients": clients,
        "idle": {"requests": len(ms[0]), "failed": idle_failed, **{f"p{q}": pct(ms[0], q / 100) for q in (50, 90, 99)}},
        "loaded": {"requests": len(ms[1]), "failed": busy_failed, **{f"p{q}": pct(ms[1], q / 100) for q in (50, 90, 99)}},
        "p50_ratio": pct(ms[1], 0.5) / pct(ms[0], 0.5),
        "explanations": {
            "answered": len(explained["seconds"]),
            "statuses": {str(k): v for k, v in sorted(explained["statuses"].items())},
            "per_minute": 60 * len(explained["seconds"]) / elapsed,
            "median_s": statistics.median(explained["seconds"]) if explained["seconds"] else None,
        },
    }


def report(out: dict[str, Any]) -> str:
    c = out["cpu"]
    lines = [
        f"headwise /explain · {out['model']} · {c['cores']} cores ({c['model']}; "
        f"{', '.join(c['flags']) or 'no avx2/avx512'}) · {out['when']}",
        "",
        "| text | forward passes | /encode | /explain | wall ratio | inference ratio | per pass |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, r in out["cost"].items():
        lines.append(
            f"| {n} tokens | {r['passes']} | {r['encode_ms']:.1f} ms | {r['explain_ms']:.0f} ms | "
            f"{r['wall_ratio']:.0f}x | {r['inference_ratio']:.0f}x | {r['explain_ms_per_pass']:.1f} ms |"
        )
    i = out["interference"]
    e = i["explanations"]
    median = f"{e['median_s']:.1f} s" if e["median_s"] is not None else "-"
    lines += [
        "",
        f"/encode of one {out['load_tokens']}-token text, one interactive client (think time "
        f"{i['think_s'] * 1e3:.0f} ms, exponential):",
        "",
        "| server | requests | p50 | p90 | p99 | failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, key in (("idle", "idle"), (f"{i['explain_clients']} clients looping /explain", "loaded")):
        r = i[key]
        lines.append(
            f"| {name} | {r['requests']} | {r['p50']:.1f} ms | {r['p90']:.1f} ms | "
            f"{r['p99']:.1f} ms | {r['failed']} |"
        )
    lines += [
        "",
        f"p50 loaded / idle: {i['p50_ratio']:.2f}x (goal: within 2x). Explanations meanwhile: "
        f"{e['answered']} answered ({e['per_minute']:.1f}/min, median {median}), "
        f"statuses {e['statuses']}.",
        f"Settings: {out['settings'] or 'defaults'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.explain")
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--lengths", default="32,256", help="tokens of the texts whose cost is measured")
    p.add_argument("--load-tokens", type=int, default=128, help="tokens of the interference texts")
    p.add_argument("--runs", type=int, default=3, help="/explain requests per length")
    p.add_argument("--encodes", type=int, default=30, help="/encode requests per length")
    p.add_argument("--seconds", type=float, default=60.0, help="each interference phase")
    p.add_argument("--think-ms", type=float, default=50.0)
    p.add_argument("--clients", type=int, default=2, help="clients looping /explain")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    bundle = load_bundle(args.bundle, verify=False)
    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    limit = bundle.manifest.max_length
    lengths = [min(int(n), limit) for n in args.lengths.split(",")]
    load_tokens = min(args.load_tokens, limit)
    env = dict(kv.split("=", 1) for kv in args.env)
    out: dict[str, Any] = {
        "model": bundle.manifest.name,
        "cpu": cpu(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "settings": env,
        "load_tokens": load_tokens,
        "cost": {},
    }
    proc, url = launch(args.bundle, env)
    try:
        for n in lengths:
            log.info("cost at %d tokens", n)
            out["cost"][str(n)] = cost(url, texts_of(tokenizer, n, 1, n)[0], args.runs, args.encodes)
        log.info("interference at %d tokens, %g s a phase", load_tokens, args.seconds)
        text, *others = texts_of(tokenizer, load_tokens, 9, 0)
        out["interference"] = asyncio.run(
            interference(url, text, others, args.seconds, args.think_ms / 1e3, args.clients)
        )
    finally:
        stop(proc)
    save(args.out, "explain", out, report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
