"""python -m bench --bundle B [--url URL] [--peer URL] [--json FILE]

One run measures headwise through HTTP (one text per request, several concurrencies) and, on
the same machine and corpus, the limits to compare against: the bundle's graph called directly
on length-sorted batches, one direct call's latency, sentence-transformers' encode, the int8
graph, ONNX Runtime's GEMM peak. Prints a markdown table of ratios; writes JSON for the record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
from pathlib import Path

import numpy as np

from bench import baselines, corpus, int8, plots
from bench.loadgen import LoadResult, build_requests, run_load
from bench.report import render
from bench.server import get, launch
from service.bundle import load_bundle

log = logging.getLogger("bench")


def scrape(url: str) -> dict[str, float]:
    """Counters of the encode path, for padding and batch figures over a run."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(get(f"{url}/metrics").decode()):
        for s in family.samples:
            if s.labels.get("path") == "encode":
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def load(
    url: str, path: str, texts: list[str], concurrency: int, total: int, openai: bool = False
) -> LoadResult:
    requests = build_requests(url, path, texts, openai=openai)
    asyncio.run(run_load(url, requests, concurrency, min(total, 64)))  # warm connections
    return asyncio.run(run_load(url, requests, concurrency, total))


def model_folder(manifest) -> Path | None:
    """The model's own folder, for sentence-transformers: a folder source, or the package's."""
    if manifest.source.kind == "package":
        try:
            from models.weights import default_model_dir

            return default_model_dir()
        except (ImportError, FileNotFoundError):
            return None
    path = Path(manifest.source.id)
    return path if path.exists() else None


def short_text_latency(
    url: str, text: str, direct: tuple[Path, list[int]], rounds: int = 5, block: int = 200
) -> dict:
    """p50 of one short text through HTTP (1 client) and of one direct call of the same graph,
    measured in alternating blocks so that load from other programs falls on both alike."""
    graph, sequence = direct
    s = baselines.session(graph)
    requests = build_requests(url, "/encode", [text])
    asyncio.run(run_load(url, requests, 1, 100))
    http_times: list[float] = []
    direct_times: list[float] = []
    errors = 0
    for _ in range(rounds):
        direct_times += baselines.single_call_times(s, sequence, block // 2)
        r = asyncio.run(run_load(url, requests, 1, block))
        http_times += r.latencies
        errors += r.errors
    http_times.sort()
    return {
        "p50_ms": float(np.median(http_times)) * 1e3,
        "p95_ms": http_times[int(0.95 * len(http_times))] * 1e3,
        "direct_p50_ms": float(np.median(direct_times)) * 1e3,
        "requests": len(http_times),
        "errors": errors,
    }


def http_int8_vs_fp32(
    bundle: Path, url: str, texts: list[str], env: dict[str, str], total: int, rounds: int = 2
) -> dict:
    """32 clients, one text per request, on the fp32 server at `url` and on a second server
    serving the int8 graph; runs alternate (best of `rounds` each), and the idle server's
    threads do not spin."""
    proc, url8 = launch(
        bundle, {"HEADWISE_ATTENTION_ENABLED": "false", **env, "HEADWISE_PRECISION": "int8"}
    )
    best = {"fp32": 0.0, "int8": 0.0}
    try:
        for _ in range(rounds):
            for key, u in (("fp32", url), ("int8", url8)):
                log.info("HTTP load: %s server, 32 clients, %d requests …", key, total)
                r = load(u, "/encode", texts, 32, total)
                if not r.errors:
                    best[key] = max(best[key], r.rps)
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "concurrency": 32,
        "fp32_texts_per_s": best["fp32"],
        "int8_texts_per_s": best["int8"],
        "speedup": best["int8"] / best["fp32"] if best["fp32"] else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--url", help="measure this running server instead of starting one")
    p.add_argument(
        "--peer", help="another server speaking /v1/embeddings, measured under the same load"
    )
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=1536, help="requests per concurrency level")
    p.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    p.add_argument(
        "--quality-pairs",
        type=int,
        help="held-out query -> document pairs for int8's retrieval figures (default: all)",
    )
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="draw PNGs")
    p.add_argument(
        "--server-env", action="append", default=[], help="KEY=VALUE for the started server"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    manifest = load_bundle(args.bundle, verify=False).manifest
    d, layers, d_ff = manifest.d_model, manifest.num_layers, manifest.d_ff
    texts = corpus.sentences(args.texts)
    sequences = baselines.tokenize(args.bundle / "tokenizer.json", texts)
    lengths = np.array([len(s) for s in sequences])
    flops = sum(baselines.flops_per_text(int(n), d, d_ff, layers) for n in lengths) / len(texts)
    results: dict = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "corpus": {
            "texts": len(texts),
            "sha": corpus.fingerprint(texts),
            "tokens_mean": float(lengths.mean()),
            "tokens_min": int(lengths.min()),
            "tokens_max": int(lengths.max()),
        },
        "model": manifest.name,
        "flops_per_text": flops,
    }

    log.info("GEMM peak …")
    results["gemm_peak_gflops"] = baselines.gemm_peak(d, d_ff)
    log.info("graph direct, length-sorted batches of 32 …")
    rate, fp32 = baselines.graph_direct(args.bundle / "encoder.onnx", sequences)
    results["graph_direct"] = rate
    short = min(sequences, key=len)
    results["single_call_latency_s"] = baselines.single_call_latency(
        args.bundle / "encoder.onnx", short
    )
    has_int8 = "encoder_int8" in manifest.graphs
    if has_int8:
        log.info("int8 vs fp32 graph, rounds interleaved …")
        int8_path = args.bundle / manifest.graphs["encoder_int8"].file
        (rate32, rate8), (_, out8) = int8.interleaved_rates(
            [args.bundle / "encoder.onnx", int8_path], sequences
        )
        lo, mean = baselines.min_cosine(out8, fp32)
        results["int8"] = {
            "graph_direct": rate8,
            "fp32_graph_direct": rate32,
            "speedup": rate8 / rate32,
            "min_cosine": lo,
            "mean_cosine": mean,
            "kept_fp32": len(manifest.graphs["encoder_int8"].kept_fp32),
            "quantised": manifest.graphs["encoder_int8"].quantised,
        }
        if manifest.task == "embed":
            log.info("int8 vs fp32: retrieval on held-out pairs …")
            results["int8"]["holdout"] = int8.holdout_quality(
                args.bundle, manifest, args.quality_pairs
            )
    log.info("sentence-transformers …")
    source = model_folder(manifest)
    results["sentence_transformers"] = (
        baselines.sentence_transformers_rate(source, texts) if source is not None else None
    )

    direct = (args.bundle / "encoder.onnx", short)
    proc = None
    url = args.url
    env = dict(kv.split("=", 1) for kv in args.server_env)
    if url is None:
        proc, url = launch(args.bundle, {"HEADWISE_ATTENTION_ENABLED": "false", **env})
    try:
        short_text = texts[min(range(len(texts)), key=lambda i: len(sequences[i]))]
        log.info("HTTP latency: one short text, 1 client, blocks alternated with direct calls …")
        results["latency_short"] = {
            "tokens": len(short),
            **short_text_latency(url, short_text, direct),
        }
        runs = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            total = args.requests if c > 1 else min(args.requests, 400)
            log.info("HTTP load: concurrency %d, %d requests …", c, total)
            before = scrape(url)
            r = load(url, "/encode", texts, c, total)
            after = scrape(url)
            real = after.get("headwise_tokens_total", 0) - before.get("headwise_tokens_total", 0)
            pad = after.get("headwise_padded_tokens_total", 0) - before.get(
                "headwise_padded_tokens_total", 0
            )
            batches = after.get("headwise_batch_size_count", 0) - before.get(
                "headwise_batch_size_count", 0
            )
            runs.append(
                {
                    "concurrency": c,
                    "requests": r.requests,
                    "errors": r.errors,
                    "texts_per_s": r.rps,
                    "p50_ms": r.percentile(50) * 1e3,
                    "p95_ms": r.percentile(95) * 1e3,
                    "p99_ms": r.percentile(99) * 1e3,
                    "padding_ratio": 1 - real / pad if pad else None,
                    "mean_batch": (
                        after.get("headwise_batch_size_sum", 0)
                        - before.get("headwise_batch_size_sum", 0)
                    )
                    / batches
                    if batches
                    else None,
                    "tokens_per_s": r.rps * float(lengths.mean()),
                }
            )
        results["http"] = runs
        if has_int8 and args.url is None:
            results["int8"]["http"] = http_int8_vs_fp32(args.bundle, url, texts, env, args.requests)
        if args.peer:
            log.info("peer server %s …", args.peer)
            r = load(args.peer, "/v1/embeddings", texts, 32, args.requests, openai=True)
            results["peer"] = {"url": args.peer, "texts_per_s": r.rps, "errors": r.errors}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    table = render(results)
    args.json.with_suffix(".md").write_text(table + "\n")
    if args.plots:
        for path in plots.draw(results, args.json.with_suffix("")):
            log.info("drew %s", path)
    print(table)  # noqa: T201 - the table is the program's output
    log.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
