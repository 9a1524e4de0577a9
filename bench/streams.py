"""python -m bench.streams --bundle B: how OpenVINO should run a serving graph on this CPU.

One infer request with every thread (PERFORMANCE_HINT LATENCY: what headwise's OpenVinoSession
compiles, the batcher running one batch at a time) against OpenVINO's streams with asynchronous
infer requests (THROUGHPUT: as many streams and requests as OpenVINO finds optimal here), in fp32
and, where the CPU has bf16 units, bf16: texts/s on length-sorted batches of 32 and of 4 (rounds
interleaved), and one short text's p50 latency.

Writes bench/results/streams.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bench import corpus
from bench.baselines import padded
from bench.results_io import cpu_machine, save, where
from service.engine.cpu import detect
from service.engine.openvino_session import PRECISIONS
from service.manifest import Manifest

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


def main() -> None:
    import openvino

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = Manifest.model_validate_json((args.bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    tok.enable_truncation(max_length=manifest.max_length)
    sequences = [e.ids for e in tok.encode_batch(corpus.sentences(args.texts))]
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
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
