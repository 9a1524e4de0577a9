"""python -m bench.chunking --bundle B: what chunking a long document costs, late vs separate.

Real prose (CPython's own documentation, bench.corpus's source) cut into documents of about
`--words` words each (several times the model's limit), sent one document a request to
`headwise serve` on /encode by `--clients` clients:

- truncated: the document as one input, cut at the model's limit (the baseline: one window);
- late: `"chunking": {"strategy": "late", "size": S}`, the document run as overlapping windows
  of the model's maximum, each chunk pooled from its tokens' states;
- separate: `"chunking": {"strategy": "separate", "size": S}`, each chunk embedded on its own.

Reported: documents/s, chunks/s and ms a document, and late against separate in the same run.
Writes bench/results/chunking.{json,md}. `--tiny`: few documents and rounds (CI's smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.results_io import machine, save
from bench.server import launch, stop

log = logging.getLogger("chunking")
RESULTS = Path("bench/results")


def documents(n: int, words: int) -> list[str]:
    """n documents of about `words` words of real prose, each a different stretch of it."""
    import pydoc_data.topics as topics

    text = re.sub(r"\s+", " ", " ".join(topics.topics.values())).split(" ")
    return [" ".join(text[i * words : (i + 1) * words]) for i in range(n)]


def whole_lengths(bundle: Path, docs: list[str]) -> list[int]:
    """Each document's tokens, uncut (the server's /tokenize cuts at the model's limit)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    tokenizer.no_truncation()
    return [len(e.ids) for e in tokenizer.encode_batch(docs, add_special_tokens=False)]


async def run(url: str, bodies: list[dict[str, Any]], clients: int) -> dict[str, float]:
    """Every body once per client in turn; documents/s, chunks/s, ms a document."""
    chunks = 0
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        r = await c.post("/encode", json=bodies[0])  # warm this shape
        assert r.status_code == 200, r.text[:300]

        async def loop(k: int) -> None:
            nonlocal chunks
            for i in range(len(bodies)):
                body = bodies[(i + k) % len(bodies)]
                t0 = time.perf_counter()
                r = await c.post("/encode", json=body)
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text[:300]
                got = r.json()
                chunks += len(got["chunks"][0]) if "chunks" in got else 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(k) for k in range(clients)))
        elapsed = time.perf_counter() - t0
    docs = clients * len(bodies)
    latencies.sort()
    return {"docs_per_s": docs / elapsed, "chunks_per_s": chunks / elapsed,
            "chunks_per_doc": chunks / docs, "p50_ms": 1e3 * latencies[len(latencies) // 2]}  # fmt: skip


def measure(bundle: Path, docs: list[str], sizes: list[int], clients: int, rounds: int) -> dict[str, Any]:
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "600", "HEADWISE_ATTENTION_ENABLED": "false"}
    proc, url = launch(bundle, env)
    out: dict[str, Any] = {}
    try:
        info = httpx.get(f"{url}/info", timeout=30).json()
        out["max_length"] = info.get("max_input_length") or info.get("max_length")
        tokens = whole_lengths(bundle, docs)
        out["tokens_per_doc"] = sum(tokens) / len(tokens)
        cases: dict[str, list[dict[str, Any]]] = {
            "truncated": [{"inputs": d, "truncate": True} for d in docs]
        }
        for s in sizes:
            for strategy in ("late", "separate"):
                chunking = {"strategy": strategy, "size": s}
                cases[f"{strategy} {s}"] = [{"inputs": d, "chunking": chunking} for d in docs]
        rates: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        for _ in range(rounds):  # rounds interleaved: the machine's load falls on every case
            for name, bodies in cases.items():
                log.info("%s", name)
                rates[name].append(asyncio.run(run(url, bodies, clients)))
        out["cases"] = {name: {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0]}
                        for name, rs in rates.items()}  # fmt: skip (medians over rounds)
    finally:
        stop(proc)
    return out


def report(r: dict[str, Any]) -> str:
    cases = r["cases"]
    lines = [
        f"headwise chunking · {r['bundle']} (max {r['max_length']} tokens) · {r['documents']} "
        f"documents of ~{r['tokens_per_doc']:.0f} tokens · {r['clients']} clients · "
        f"{r['cpus']} cores ({r['cpu_flags']}) · {r['when']}",
        "",
        "| case | docs/s | chunks/doc | chunks/s | p50 ms a doc | docs/s vs separate |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, c in cases.items():
        strategy, _, size = name.partition(" ")
        other = cases.get(f"separate {size}") if size else None
        vs = f"{c['docs_per_s'] / other['docs_per_s']:.2f}x" if other else "-"
        lines.append(f"| {name} | {c['docs_per_s']:.2f} | {c['chunks_per_doc']:.1f} | "
                     f"{c['chunks_per_s']:.1f} | {c['p50_ms']:.0f} | {vs} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chunking")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--words", type=int, default=1500, help="words a document")
    p.add_argument("--sizes", default="64,128", help="chunk sizes in tokens")
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="2 short documents, 1 round: the smoke test")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    n, words, rounds = (2, 60, 1) if args.tiny else (args.documents, args.words, args.rounds)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {"bundle": str(args.bundle), "documents": n, "clients": args.clients, **machine(),
               **measure(args.bundle, documents(n, words), sizes, args.clients, rounds)}  # fmt: skip
    save(args.out, "chunking", results, report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
