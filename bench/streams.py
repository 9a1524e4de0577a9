"""python -m bench.streams --bundle B: how OpenVINO should run a serving graph on this CPU.

One infer request with every thread (PERFORMANCE_HINT LATENCY: what headwise's OpenVinoSession
compiles by default, the batcher running one batch at a time) against OpenVINO's streams with
asynchronous infer requests (THROUGHPUT: as many streams and requests as OpenVINO finds optimal
here), in fp32
and, where the CPU has bf16 units, bf16: texts/s on length-sorted batches of 32 and of 4 (rounds
interleaved), and one short text's p50 latency.

Then the same choice inside the server (HEADWISE_OPENVINO_STREAMS: 1, the default below 16
CPUs, or 2 and more: the batcher computes that many batches at once, one per stream): over
HTTP, 32 clients sending one text a request (texts/s: batches as the server forms them, its
request handling on the same cores) and one client's short text (p50): a server per stream
count, all up at once, measured in alternating rounds.

Writes bench/results/streams.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bench import corpus
from bench.baselines import padded
from bench.loadgen import build_requests, run_load
from bench.results_io import cpu_machine, save, where
from bench.server import launch
from service.engine.cpu import detect
from service.engine.openvino_session import PRECISIONS

log = logging.getLogger("bench")
RESULTS = Path("bench/results")
SHORT = "The cat sat on a warm mat."
HINTS = {"one request, every thread": "LATENCY", "streams, async requests": "THROUGHPUT"}


def batches(sequences: list[list[int]], size: int) -> list[dict[str, np.ndarray]]:
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    feeds = []
    for start in range(0, len(order), size):
        ids, mask = padded([sequences[i] for i in order[start : start + size]])
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds


def timed(compiled: Any, feeds: list[dict[str, np.ndarray]], streams: bool) -> float:
    """Seconds for every batch: in turn on one request, or queued on OpenVINO's optimal number
    of asynchronous requests (its streams run them at once)."""
    import openvino

    t0 = time.perf_counter()
    if streams:
        queue = openvino.AsyncInferQueue(
            compiled, compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        )
        for feed in feeds:
            queue.start_async(feed)
        queue.wait_all()
    else:
        request = compiled.create_infer_request()
        for feed in feeds:
            request.infer(feed)
    return time.perf_counter() - t0


def launched(bundle: Path, precision: str, streams: int) -> tuple[Any, str]:
    env = {
        "HEADWISE_RUNTIME": "openvino",
        "HEADWISE_PRECISION": precision,
        "HEADWISE_OPENVINO_STREAMS": str(streams),
    }
    return launch(bundle, env=env, ready_s=300)


def measured(url: str, texts: list[str]) -> dict[str, float]:
    """32 clients sending one text a request (texts/s), then one client's short text (p50)."""
    many = build_requests(url, "/encode", texts)
    loaded = asyncio.run(run_load(url, many, 32, 600))
    one = build_requests(url, "/encode", [SHORT])
    asyncio.run(run_load(url, one, 1, 20))
    alone = asyncio.run(run_load(url, one, 1, 100))
    return {
        "texts_per_s": loaded.rps,
        "short_p50_ms": alone.percentile(50) * 1e3,
        "errors": loaded.errors + alone.errors,
    }


def over_http(
    bundle: Path, precisions: list[str], texts: list[str], rounds: int
) -> list[dict[str, Any]]:
    """Per precision, a server per stream count (1, 2, and half the cores where that is more),
    all up at once and measured in alternating rounds (a shared VM's speed drifts by a third
    between minutes: each round compares servers within the same minute). The medians, and each
    round's ratio to one stream."""
    counts = sorted({1, 2, (os.cpu_count() or 2) // 2})
    rows = []
    for precision in precisions:
        servers = {n: launched(bundle, precision, n) for n in counts}
        try:
            for _, url in servers.values():  # warm: the first batches of every shape
                asyncio.run(run_load(url, build_requests(url, "/encode", texts), 32, 300))
            runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
            for _ in range(rounds):
                for n, (_, url) in servers.items():
                    runs[n].append(measured(url, texts))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
        base = runs[1]
        for n, got in runs.items():
            rows.append(
                {
                    "precision": precision,
                    "streams": n,
                    "texts_per_s_32_clients": statistics.median(r["texts_per_s"] for r in got),
                    "short_p50_ms": statistics.median(r["short_p50_ms"] for r in got),
                    "throughput_ratios": [
                        r["texts_per_s"] / b["texts_per_s"] for r, b in zip(got, base, strict=True)
                    ],
                    "latency_ratios": [
                        r["short_p50_ms"] / b["short_p50_ms"]
                        for r, b in zip(got, base, strict=True)
                    ],
                    "errors": sum(int(r["errors"]) for r in got),
                }
            )
    return rows


def main() -> None:
    import openvino

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--http-rounds", type=int, default=6, help="alternating rounds (0: none)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest, sequences = corpus.tokenized(args.bundle, corpus.sentences(args.texts))
    tok = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    cpu = detect()
    precisions = ["fp32", "bf16"] if cpu.bf16 else ["fp32"]
    core = openvino.Core()
    model = core.read_model(str(args.bundle / manifest.graphs["encoder"].file))
    compiled = {
        (precision, way): core.compile_model(
            model,
            "CPU",
            {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": PRECISIONS[precision]},
        )
        for precision in precisions
        for way, hint in HINTS.items()
    }
    rows: dict[tuple[str, str], dict[str, Any]] = {
        key: {
            "precision": key[0],
            "way": key[1],
            "streams": int(c.get_property("NUM_STREAMS")),
            "requests": int(c.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")),
        }
        for key, c in compiled.items()
    }
    for size in (32, 4):
        feeds = batches(sequences, size)
        best = dict.fromkeys(compiled, float("inf"))
        for _ in range(args.rounds):  # interleaved: a shared machine's noise falls on all alike
            for key, c in compiled.items():
                best[key] = min(best[key], timed(c, feeds, key[1] != "one request, every thread"))
        for key in compiled:
            rows[key][f"texts_per_s_{size}"] = len(sequences) / best[key]
    one = np.array([tok.encode(SHORT).ids], np.int64)
    feed = {"input_ids": one, "attention_mask": np.ones_like(one)}
    for key, c in compiled.items():
        request = c.create_infer_request()
        for _ in range(20):
            request.infer(feed)
        times = []
        for _ in range(300):
            t0 = time.perf_counter()
            request.infer(feed)
            times.append(time.perf_counter() - t0)
        rows[key]["short_p50_ms"] = statistics.median(times) * 1e3
    results = {
        "machine": cpu_machine(),
        "bundle": manifest.name,
        "openvino": str(openvino.get_version()).split("-")[0],
        "rows": list(rows.values()),
        "http": over_http(args.bundle, precisions, corpus.sentences(512), args.http_rounds),
    }
    save(args.out, "streams", results, report(results))


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# OpenVINO: one request with every thread, or streams",
        "",
        f"{where(m)}; OpenVINO {results['openvino']}; {results['bundle']}.",
        "",
        "| precision | how | streams / requests | texts/s, batches of 32 | texts/s, batches of 4 "
        "| one text p50 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['precision']} | {r['way']} | {r['streams']} / {r['requests']} "
            f"| {r['texts_per_s_32']:.0f} | {r['texts_per_s_4']:.0f} | {r['short_p50_ms']:.2f} ms |"
        )
    http = results.get("http") or []
    if http:
        lines += [
            "",
            "## In the server (HEADWISE_OPENVINO_STREAMS)",
            "",
            "Servers of each stream count up at once, measured in alternating rounds: 32 clients "
            "sending one text a request (texts/s), then one client's short text (p50). Medians of "
            "the rounds; against one stream, the median and range of the rounds' ratios:",
            "",
            "| precision | streams | texts/s, 32 clients | vs 1 stream | one text p50 | vs 1 stream |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]

        def ratio(values: list[float]) -> str:
            middle = statistics.median(values)
            return f"{middle:.2f}x ({min(values):.2f}-{max(values):.2f})"

        for r in http:
            lines.append(
                f"| {r['precision']} | {r['streams']} | {r['texts_per_s_32_clients']:.0f} "
                f"| {ratio(r['throughput_ratios'])} | {r['short_p50_ms']:.2f} ms "
                f"| {ratio(r['latency_ratios'])} |"
            )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
