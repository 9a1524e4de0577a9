"""python -m bench.workers --bundle B [--bundle B2 ...]: one server process or several.

Per bundle, a server of one process (every CPU's threads, HEADWISE_WORKERS=1) and one of
several (HEADWISE_WORKERS: by default one per CPU the bench may use, each pinned to its CPU),
both up at once with the same runtime choice (the default: auto), measured in alternating
rounds (a shared VM's speed drifts between minutes): 32 clients sending one text a request
(texts/s: the load one event loop caps on a many-core machine), the same 32 clients sending 32
texts a request, and one client's short text (p50: a worker runs it with its slice's threads).
A small or random-weight bundle shows the server's own ceiling: with a cheap graph the event
loop, not the model, is what one process runs out of.

Writes bench/results/workers.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
from pathlib import Path
from typing import Any

from bench import corpus
from bench.loadgen import build_requests, run_load
from bench.results_io import cpu_machine, save, where
from bench.server import launch, stop
from service.engine.cpu import cores
from service.manifest import Manifest

log = logging.getLogger("bench")
RESULTS = Path("bench/results")
SHORT = "The cat sat on a warm mat."


def measured(url: str, texts: list[str], total: int) -> dict[str, float]:
    one_each = build_requests(url, "/encode", texts)
    loaded = asyncio.run(run_load(url, one_each, 32, total))
    grouped = build_requests(url, "/encode", texts, per_request=32)
    batched = asyncio.run(run_load(url, grouped, 32, max(32, total // 32)))
    short = build_requests(url, "/encode", [SHORT])
    asyncio.run(run_load(url, short, 1, 20))
    alone = asyncio.run(run_load(url, short, 1, 200))
    return {
        "texts_per_s": loaded.rps,
        "texts_per_s_32_a_request": batched.rps * 32,
        "short_p50_ms": alone.percentile(50) * 1e3,
        "errors": loaded.errors + batched.errors + alone.errors,
    }


def compare(bundle: Path, workers: int, texts: list[str], rounds: int, total: int) -> dict:
    counts = (1, workers)
    servers = {n: launch(bundle, env={"HEADWISE_WORKERS": str(n)}, ready_s=300) for n in counts}
    try:
        for _, url in servers.values():  # warm: every worker's first batches of each shape
            asyncio.run(run_load(url, build_requests(url, "/encode", texts), 32, 600))
        runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        for r in range(rounds):
            for n, (_, url) in servers.items():
                runs[n].append(measured(url, texts, total))
            log.info("round %d of %d: %s", r + 1, rounds, {n: runs[n][-1] for n in counts})
    finally:
        for proc, _ in servers.values():
            stop(proc)
    manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
    rows = []
    for n in counts:
        got, base = runs[n], runs[1]
        row: dict[str, Any] = {"workers": n, "errors": sum(int(x["errors"]) for x in got)}
        for key in ("texts_per_s", "texts_per_s_32_a_request", "short_p50_ms"):
            row[key] = statistics.median(x[key] for x in got)
            row[f"{key}_ratios"] = [x[key] / b[key] for x, b in zip(got, base, strict=True)]
        rows.append(row)
    return {
        "bundle": manifest.name,
        "layers": manifest.num_layers,
        "d_model": manifest.d_model,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, action="append", required=True)
    p.add_argument("--workers", type=int, default=0, help="0: one per usable CPU (at least 2)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=2000, help="per round, 32 clients")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    workers = args.workers or max(2, cores().usable)
    texts = corpus.sentences(512)
    results = {
        "machine": cpu_machine(),
        "workers": workers,
        "bundles": [compare(b, workers, texts, args.rounds, args.requests) for b in args.bundle],
    }
    save(args.out, "workers", results, report(results))


def report(results: dict[str, Any]) -> str:
    def ratio(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

    lines = [
        "# One server process or several (HEADWISE_WORKERS)",
        "",
        f"{where(results['machine'])}. Servers up at once, alternating rounds; medians, and "
        "against one process the median and range of the rounds' ratios. The runtime and "
        "precision are the defaults' choice on this CPU.",
        "",
        "| bundle | workers | texts/s, 32 clients x 1 text | vs 1 | texts/s, 32 clients x 32 "
        "texts | vs 1 | one text p50 | vs 1 | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for b in results["bundles"]:
        for r in b["rows"]:
            lines.append(
                f"| {b['bundle']} ({b['layers']} layers, d {b['d_model']}) | {r['workers']} | {r['texts_per_s']:.0f} "
                f"| {ratio(r['texts_per_s_ratios'])} | {r['texts_per_s_32_a_request']:.0f} "
                f"| {ratio(r['texts_per_s_32_a_request_ratios'])} | {r['short_p50_ms']:.2f} ms "
                f"| {ratio(r['short_p50_ms_ratios'])} | {r['errors']} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
