"""python -m bench.tiles --bundle B: whether OpenVINO should pad a batch up to the CPU's tile.

service/engine/tiles.py pads an OpenVINO batch up to the next multiple of 16 tokens where start-up
measured that length faster than the batch's own. This measures what it is worth, in one run:

- the start's own measurement (8 texts, then one, at each length from 17 to 32 tokens), in bf16
  where the CPU has bf16 units and in fp32, and what each would decide;
- the graph called directly on the corpus, length-sorted batches of 32, 8 and 1, each padded as
  bf16's measurement decides and at its own length (rounds interleaved), in bf16 and in fp32;
- a server each way (HEADWISE_OPENVINO_PADDING true and false, everything else automatic), both up
  and measured in alternating rounds: 32 clients sending one text a request, 32 clients of 32
  texts, one client's short text (p50).

Writes bench/results/tiles.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from bench import corpus
from bench.loadgen import build_requests, run_load
from bench.results_io import cpu_machine, save, where
from bench.server import launch, stop
from bench.streams import batches
from bench.workers import measured
from service.engine import tiles
from service.engine.cpu import detect
from service.engine.openvino_session import OpenVinoSession

log = logging.getLogger("bench")
RESULTS = Path("bench/results")
SIZES = (32, 8, 1)


def direct(
    session: OpenVinoSession, sequences: list[list[int]], rounds: int
) -> dict[int, dict[str, float]]:
    """Texts/s per batch size, padded as `session.padding` says and at each batch's own
    length: the best of `rounds` interleaved passes over the corpus."""
    measured = session.padding
    ways = {"padded": measured, "own": tiles.never("the comparison")}
    out: dict[int, dict[str, float]] = {}
    for size in SIZES:
        feeds = batches(sequences, size)
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(rounds):
            for way, padding in ways.items():
                session.padding = padding
                for feed in feeds[:2]:
                    session.run(None, feed)
                started = time.perf_counter()
                for feed in feeds:
                    session.run(None, feed)
                best[way] = min(best[way], time.perf_counter() - started)
        out[size] = {way: len(sequences) / s for way, s in best.items()}
    session.padding = measured
    return out


def over_http(bundle: Path, texts: list[str], rounds: int) -> dict[str, Any]:
    """Both servers up at once, measured in alternating rounds (a shared VM drifts between
    minutes: each round compares them within the same minute), each first in every other."""
    servers = {
        on: launch(bundle, env={"HEADWISE_OPENVINO_PADDING": str(on).lower()}, ready_s=300)
        for on in (True, False)
    }
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        for _, url in servers.values():  # warm: the first batches of every shape
            asyncio.run(run_load(url, build_requests(url, "/encode", texts), 32, 300))
        for i in range(rounds):  # in turn first (ABBA): what a round's first server meets, both do
            for on in (True, False) if i % 2 == 0 else (False, True):
                runs[on].append(measured(servers[on][1], texts, 600))
    finally:
        for proc, _ in servers.values():
            stop(proc)
    keys = ("texts_per_s", "texts_per_s_32_a_request", "short_p50_ms")
    return {
        "rounds": rounds,
        "padded": {k: statistics.median(r[k] for r in runs[True]) for k in keys},
        "own": {k: statistics.median(r[k] for r in runs[False]) for k in keys},
        "ratios": {
            k: [a[k] / b[k] for a, b in zip(runs[True], runs[False], strict=True)] for k in keys
        },
        "errors": sum(int(r["errors"]) for rs in runs.values() for r in rs),
    }


def main() -> None:
    import openvino

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--http-rounds", type=int, default=8, help="alternating rounds (0: none)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    texts = corpus.sentences(args.texts)
    manifest, sequences = corpus.tokenized(args.bundle, texts)
    graph = args.bundle / manifest.graphs["encoder"].file
    precisions = ["bf16", "fp32"] if detect().bf16 else ["fp32"]
    rows = []
    decided: tiles.Padding | None = None
    for precision in precisions:
        session = OpenVinoSession(graph, precision, most=manifest.max_length)
        start = tiles.measure(session.timer())  # what start-up would decide on this precision
        decided = decided or start  # bf16's where it runs, else fp32's
        session.padding = decided
        log.info("%s: %s", precision, start.reason)
        rows.append(
            {
                "precision": precision,
                "start": start.describe(),
                "texts_per_s": direct(session, sequences, args.rounds),
            }
        )
    results = {
        "machine": cpu_machine(),
        "bundle": manifest.name,
        "openvino": str(openvino.get_version()).split("-")[0],
        "padding": decided.describe() if decided else None,
        "rows": rows,
        "http": over_http(args.bundle, texts, args.http_rounds) if args.http_rounds else None,
    }
    save(args.out, "tiles", results, report(results))


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    padding = results["padding"]
    least = padding["least_remainder_padded"]
    lines = [
        "# OpenVINO: a batch padded up to the CPU's tile, or at its own length",
        "",
        f"{where(m)}; OpenVINO {results['openvino']}; {results['bundle']}.",
        "",
        f"Padded as {results['rows'][0]['precision']}'s start-up measurement decides: batches "
        f"from {least['batches']} tokens past a multiple of {padding['tile']}, a text alone from "
        f"{least['one_text']} (None: never).",
        "",
        "## What start-up measures (ms, the best of two passes)",
        "",
    ]
    lengths = list(results["rows"][0]["start"]["measured_ms"]["8"])
    lines += [
        "| precision | rows | " + " | ".join(lengths) + " | decides |",
        "| --- | ---: | " + " | ".join("---:" for _ in lengths) + " | --- |",
    ]
    for r in results["rows"]:
        for rows, ms in r["start"]["measured_ms"].items():
            said = r["start"]["least_remainder_padded"]["batches" if rows != "1" else "one_text"]
            lines.append(
                f"| {r['precision']} | {rows} | "
                + " | ".join(f"{ms[n]:.2f}" for n in lengths)
                + f" | {'from ' + str(said) if said is not None else 'never'} |"
            )
    lines += [
        "",
        "## The graph called directly (length-sorted batches, texts/s)",
        "",
        "| precision | batch | padded | own length | padded / own |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        for size, t in r["texts_per_s"].items():
            lines.append(
                f"| {r['precision']} | {size} | {t['padded']:.0f} | {t['own']:.0f} "
                f"| {t['padded'] / t['own']:.2f}x |"
            )
    http = results.get("http")
    if http:

        def ratio(values: list[float]) -> str:
            return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

        names = {
            "texts_per_s": ("32 clients x 1 text", "{:.0f} texts/s"),
            "texts_per_s_32_a_request": ("32 clients x 32 texts", "{:.0f} texts/s"),
            "short_p50_ms": ("one short text, p50", "{:.2f} ms"),
        }
        lines += [
            "",
            f"## In the server (HEADWISE_OPENVINO_PADDING), {http['rounds']} alternating rounds",
            "",
            "| load | padded | own length | padded / own (median, range) |",
            "| --- | ---: | ---: | ---: |",
        ]
        for key, (what, fmt) in names.items():
            lines.append(
                f"| {what} | {fmt.format(http['padded'][key])} | {fmt.format(http['own'][key])} "
                f"| {ratio(http['ratios'][key])} |"
            )
        lines += ["", f"Errors: {http['errors']}."]
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
