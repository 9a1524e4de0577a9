"""python -m bench.tracing --bundle B: what OpenTelemetry tracing costs, in one run.

The same server twice, tracing off and on (spans to a local OTLP/HTTP sink that reads and
drops them), short texts over HTTP at 1 and 32 clients, the two alternated over rounds so that a
shared machine's noise falls on both; the best round of each. Writes
bench/results/tracing.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import corpus
from bench.loadgen import build_requests, run_load
from bench.results_io import machine, save
from bench.server import launch

RESULTS = Path("bench/results")


class Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def measure(bundle: Path, env: dict[str, str], texts: list[str], rounds: int) -> dict[str, Any]:
    proc, url = launch(bundle, env=env)
    try:
        best: dict[str, dict[str, float]] = {}
        requests = build_requests(url, "/encode", texts)
        asyncio.run(run_load(url, requests, 8, 200))
        for _ in range(rounds):
            for clients, total in ((1, 400), (32, 1600)):
                r = asyncio.run(run_load(url, requests, clients, total))
                key = str(clients)
                if key not in best or r.rps > best[key]["texts_per_s"]:
                    best[key] = {"texts_per_s": r.rps, "p50_ms": r.percentile(50) * 1e3}
        return best
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    texts = [t for t in corpus.sentences(512) if len(t.split()) <= 12] or corpus.sentences(64)
    runs: dict[str, Any] = {"off": {}, "on": {}}
    for _ in range(2):  # off, on, off, on: each keeps its best
        for mode, env in (("off", {}), ("on", {"HEADWISE_OTLP_ENDPOINT": endpoint})):
            got = measure(args.bundle, env, texts, args.rounds)
            for k, v in got.items():
                if k not in runs[mode] or v["texts_per_s"] > runs[mode][k]["texts_per_s"]:
                    runs[mode][k] = v
    sink.shutdown()
    results = {"machine": machine(), "runs": runs}
    lines = [
        "# Tracing's cost",
        "",
        f"{results['machine']['cpus']} cores, flags: {results['machine']['cpu_flags']}; "
        f"{results['machine']['when']}; short texts, one a request, to /encode.",
        "",
        "| clients | off: texts/s | on: texts/s | on / off | off: p50 | on: p50 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in ("1", "32"):
        off, on = runs["off"][k], runs["on"][k]
        lines.append(
            f"| {k} | {off['texts_per_s']:.0f} | {on['texts_per_s']:.0f} | "
            f"{on['texts_per_s'] / off['texts_per_s']:.2f}x | {off['p50_ms']:.2f} ms | "
            f"{on['p50_ms']:.2f} ms |"
        )
    save(args.out, "tracing", results, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
