"""python -m bench.runtimes --bundle B: each runtime and precision on the same model and corpus,
in one run (service/engine/choice.py chooses among them).

Per path (ONNX Runtime fp32, the bundle's int8 graph when it has one, OpenVINO fp32, OpenVINO's
NNCF int8 graph when the bundle has one, OpenVINO bf16 where the CPU has bf16 units): the graph
called directly on length-sorted batches of 32 (rounds interleaved, so that a shared machine's
noise falls on all alike), one short text's p50 latency, retrieval on the held-out query ->
document pairs against ONNX Runtime fp32 (recall@10, MRR), and a server started on that path
(HEADWISE_RUNTIME, HEADWISE_PRECISION) over HTTP at 1 and 32 clients, one text a request, and at
32 clients of 32 texts a request (an indexing client). A path this CPU cannot run is listed with
why.

Writes bench/results/runtimes.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bench import corpus
from bench.baselines import single_call_times
from bench.int8 import sessions_rates
from bench.loadgen import build_requests, run_load
from bench.results_io import cpu_machine, save, where
from bench.server import launch
from bench.soak import proc_memory
from service.engine import quality
from service.engine.choice import choose
from service.engine.cpu import detect
from service.engine.openvino_session import OpenVinoSession, available
from service.engine.sessions import build_session
from service.manifest import Manifest
from service.settings import Settings

log = logging.getLogger("bench")
RESULTS = Path("bench/results")
SHORT = "The cat sat on a warm mat."  # 11 tokens with MiniLM's tokenizer
ROUNDS = 5  # the graph direct and over HTTP in turn: one short text; the indexing load
PAUSE_S = 0.2  # idle before each request that tells a cold run from a compile
PER_REQUEST = 32  # texts a request of the batched load (a graph batch's worth)
LONG = " ".join(["every token attends to every other token"] * 30)  # cut at 256 tokens


def paths(bundle: Path, manifest: Manifest) -> tuple[list[tuple[str, str]], list[str]]:
    """The (runtime, precision) paths to run here, and the ones skipped with why."""
    run, skipped = [("onnxruntime", "fp32")], []
    if "encoder_int8" in manifest.graphs:
        run.append(("onnxruntime", "int8"))
    if available() is None:
        skipped.append("openvino: not installed")
        return run, skipped
    run.append(("openvino", "fp32"))
    if "encoder_int8_openvino" in manifest.graphs:
        run.append(("openvino", "int8"))
    else:
        skipped.append("openvino int8: the bundle has no OpenVINO int8 graph (export --int8)")
    cpu = detect()
    if cpu.bf16:
        run.append(("openvino", "bf16"))
    else:
        skipped.append(f"openvino bf16: this CPU has no bf16 units ({cpu.describe()})")
    return run, skipped


def session(bundle: Path, manifest: Manifest, runtime: str, precision: str) -> Any:
    if runtime == "openvino":
        key = "encoder_int8_openvino" if precision == "int8" else "encoder"
        return OpenVinoSession(bundle / manifest.graphs[key].file, precision)
    key = "encoder_int8" if precision == "int8" else "encoder"
    return build_session(bundle / manifest.graphs[key].file, threads=0, spin=True)


def retrieval(sessions: list[Any], tok: Tokenizer, pairs: quality.Pairs) -> list[dict[str, float]]:
    """recall@10 and MRR of each session, and the first's (ONNX Runtime fp32) for reference."""

    def run(s: Any) -> quality.Run:
        return lambda feeds: np.asarray(s.run(["sentence_embedding"], feeds)[0])

    inputs = ["input_ids", "attention_mask"]
    out = []
    for s in sessions:
        q = quality.judge(run(sessions[0]), run(s), tok, inputs, pairs)
        out.append({"recall_at_10": q.recall_at_10, "mrr": q.mrr, "min_cosine": q.min_cosine})
    return out


def first_and_steady(url: str, text: str, after: int = 50, pauses: int = 5) -> dict[str, float]:
    """The first request of this shape after /ready, the median of the next `after`, and the
    median of `pauses` more, each after PAUSE_S idle: a request that compiled (a shape warm-up
    did not cover) shows as a first far slower than those, while threads and caches that cooled
    while the server waited slow a request after a pause as much as the first."""
    import httpx

    times, paused = [], []
    with httpx.Client(base_url=url, timeout=60) as client:
        client.get("/health").raise_for_status()  # the connection open: not what is measured
        for k in range(1 + after + pauses):
            if k > after:
                time.sleep(PAUSE_S)
            started = time.perf_counter()
            r = client.post("/encode", json={"inputs": [text]})
            (paused if k > after else times).append((time.perf_counter() - started) * 1e3)
            r.raise_for_status()
    steady = statistics.median(times[1:])
    return {
        "first_ms": times[0],
        "steady_p50_ms": steady,
        "first_over_steady": times[0] / steady,
        "paused_over_steady": statistics.median(paused) / steady,
    }


def peak_against_bound(url: str, pid: int) -> dict[str, float]:
    """The server's peak resident memory once it has run its largest batches (a request of
    full batches of the longest texts), against the bound it states in /info (its compiled
    graphs counted in its warm size)."""
    import httpx

    with httpx.Client(base_url=url, timeout=300) as client:
        bound = client.get("/info").json()["memory"]["bound_bytes"] / 2**20
        r = client.post("/encode", json={"inputs": [LONG] * 256})
        r.raise_for_status()
    _, peak = proc_memory(pid)
    return {"peak_mb": peak, "bound_mb": bound, "peak_over_bound": peak / bound}


def over_http(
    bundle: Path,
    runtime: str,
    precision: str,
    texts: list[str],
    graph: Any,
    short: list[int],
    sequences: list[list[int]],
) -> dict[str, Any]:
    """graph: this path's session, called directly on `short` (SHORT's ids) in rounds that
    alternate with the server's answers to SHORT: on a shared VM the same call's time drifts by
    a third between minutes, so the two are compared in the same minutes."""
    env = {"HEADWISE_RUNTIME": runtime, "HEADWISE_PRECISION": precision}
    started = time.monotonic()
    proc, url = launch(bundle, env=env, ready_s=300)
    log.info("%s %s: server ready in %.0f s", runtime, precision, time.monotonic() - started)
    try:
        out: dict[str, Any] = {
            # Before any other request: is a shape compiled on the first request that has it?
            "first_short": first_and_steady(url, SHORT),
            "first_long": first_and_steady(url, LONG),
        }
        one = build_requests(url, "/encode", [SHORT])
        asyncio.run(run_load(url, one, 1, 50))
        direct, served, spaced = [], [], []
        for _ in range(ROUNDS):
            direct.append(statistics.median(single_call_times(graph, short, 100)) * 1e3)
            served.append(asyncio.run(run_load(url, one, 1, 100)).percentile(50) * 1e3)
            # The graph called as often as the server was just asked: idle between two calls
            # for as long as each request spent outside it. Its threads and caches cool as the
            # server's do between requests, so what the request takes past this is the
            # request path's own (HTTP, validation, tokenising, serialising).
            gap_s = max(0.0, served[-1] - direct[-1]) / 1e3
            times = single_call_times(graph, short, 100, gap_s=gap_s)
            spaced.append(statistics.median(times) * 1e3)
        # The graph itself after the same idle as first_and_steady's paused requests, against
        # back to back (the rounds' figure): how much the machine alone slows a run that
        # follows a pause (caches other tenants' work evicted, a halted vCPU): no compile.
        paused = statistics.median(single_call_times(graph, short, 9, gap_s=PAUSE_S)) * 1e3
        out["graph_paused_over_steady"] = paused / statistics.median(direct)
        out["short_p50_ms"] = statistics.median(served)
        out["short_graph_p50_ms"] = statistics.median(direct)
        out["short_graph_spaced_p50_ms"] = statistics.median(spaced)
        for clients, total in ((1, 300), (32, 1500)):
            requests = build_requests(url, "/encode", texts)
            asyncio.run(run_load(url, requests, clients, 64))
            r = asyncio.run(run_load(url, requests, clients, total))
            out[str(clients)] = {
                "texts_per_s": r.rps,
                "p50_ms": r.percentile(50) * 1e3,
                "errors": r.errors,
            }
        # An indexing client's way: 32 clients, each request a list of PER_REQUEST texts (the
        # server's fixed cost a request spread over as many texts as a graph batch holds).
        # In rounds that alternate with the graph on `sequences` (as the graph's own figure
        # is measured), the ratio of their medians: the VM's drift falls on both.
        requests = build_requests(url, "/encode", texts, per_request=PER_REQUEST)
        asyncio.run(run_load(url, requests, 32, 32))
        graph_rates, served_rates, p50s, errors = [], [], [], 0
        for _ in range(ROUNDS):
            graph_rates.append(sessions_rates([graph], sequences, rounds=1)[0][0])
            r = asyncio.run(run_load(url, requests, 32, 64))
            served_rates.append(r.rps * PER_REQUEST)
            p50s.append(r.percentile(50) * 1e3)
            errors += r.errors
        out["32_batched"] = {
            "texts_per_s": statistics.median(served_rates),
            "graph_texts_per_s": statistics.median(graph_rates),
            "per_request": PER_REQUEST,
            "p50_ms": statistics.median(p50s),
            "errors": errors,
        }
        out["memory"] = peak_against_bound(url, proc.pid)
        log.info(
            "%s %s: measured over HTTP in %.0f s", runtime, precision, time.monotonic() - started
        )
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--pairs", type=int, default=1000, help="held-out pairs for retrieval")
    p.add_argument("--no-http", action="store_true", help="the graph alone (no servers)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    manifest = Manifest.model_validate_json((args.bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    texts = corpus.sentences(512)
    sequences = [e.ids for e in tok.encode_batch(texts)]
    run, skipped = paths(args.bundle, manifest)
    sessions = [session(args.bundle, manifest, r, pr) for r, pr in run]
    started = time.monotonic()
    rates, _ = sessions_rates(sessions, sequences)
    log.info("graphs: %s texts/s (%.0f s)", [round(r) for r in rates], time.monotonic() - started)
    short = tok.encode(SHORT).ids
    started = time.monotonic()
    p50 = [statistics.median(single_call_times(s, short, 300)) * 1e3 for s in sessions]
    quality_rows = retrieval(sessions, tok, quality.docstring_pairs("holdout", limit=args.pairs))
    log.info("one text, retrieval: %.0f s", time.monotonic() - started)
    rows = []
    for k, (runtime, precision) in enumerate(run):
        row: dict[str, Any] = {
            "runtime": runtime,
            "precision": precision,
            "graph_texts_per_s": rates[k],
            "graph_vs_ort_fp32": rates[k] / rates[0],
            "short_p50_ms": p50[k],
            **quality_rows[k],
        }
        if not args.no_http:  # a server per path, one at a time (its own process)
            row["http"] = over_http(
                args.bundle, runtime, precision, texts, sessions[k], short, sequences
            )
        rows.append(row)
    cpu = detect()
    auto = choose(Settings(runtime="auto", precision="auto"), cpu, False, available())
    results = {
        "machine": cpu_machine(),
        "bundle": manifest.name,
        "rows": rows,
        "skipped": skipped,
        # What a server started with the defaults serves here (before its start-up judge).
        "auto": {"runtime": auto.runtime, "precision": auto.precision, "reason": auto.reason},
    }
    save(args.out, "runtimes", results, report(results))


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Runtimes and precisions on this CPU",
        "",
        f"{where(m)}; {results['bundle']}, 512 sentences, batches of 32.",
        "",
        "| runtime | precision | graph texts/s | vs ORT fp32 | one text p50 (graph) | recall@10 | MRR "
        "| HTTP 1 client | HTTP 32 clients | HTTP 32 vs ORT fp32 | HTTP 32 / graph "
        "| HTTP 32 clients x 32 texts a request, / graph in the same minutes "
        "| one text p50 HTTP / graph | one text p50 graph spaced as the requests, HTTP / it "
        "| first request / steady (short, 256 tokens; in brackets: after a pause; the graph "
        "itself after a pause) "
        "| peak RSS / bound |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    base = results["rows"][0].get("http")
    for r in results["rows"]:
        http = r.get("http")
        one = f"{http['1']['texts_per_s']:.0f}/s, p50 {http['1']['p50_ms']:.2f} ms" if http else "-"
        many = f"{http['32']['texts_per_s']:.0f}/s" if http else "-"
        gain = f"{http['32']['texts_per_s'] / base['32']['texts_per_s']:.2f}x" if http else "-"
        ratio = f"{http['32']['texts_per_s'] / r['graph_texts_per_s']:.2f}x" if http else "-"
        graph = http.get("short_graph_p50_ms", r["short_p50_ms"]) if http else 0.0
        overhead = (
            f"{http['short_p50_ms']:.2f} / {graph:.2f} ms = {http['short_p50_ms'] / graph:.2f}x"
            if http
            else "-"
        )
        batched = http.get("32_batched") if http else None
        indexing = "-"
        if batched:  # against the graph in the same minutes (a recording before: its figure)
            alone = batched.get("graph_texts_per_s", r["graph_texts_per_s"])
            indexing = f"{batched['texts_per_s']:.0f}/s, {batched['texts_per_s'] / alone:.2f}x"
        spaced = http.get("short_graph_spaced_p50_ms") if http else None
        cooled = f"{spaced:.2f} ms, {http['short_p50_ms'] / spaced:.2f}x" if spaced else "-"
        first = (
            ", ".join(
                f"{f['first_over_steady']:.2f}x"
                + (f" ({f['paused_over_steady']:.2f}x)" if "paused_over_steady" in f else "")
                for f in (http["first_short"], http["first_long"])
            )
            + (f"; {http['graph_paused_over_steady']:.2f}x" if "graph_paused_over_steady" in http else "")
            if http
            else "-"
        )
        memory = (
            f"{http['memory']['peak_mb']:.0f} / {http['memory']['bound_mb']:.0f} MB"
            if http and "memory" in http
            else "-"
        )
        lines.append(
            f"| {r['runtime']} | {r['precision']} | {r['graph_texts_per_s']:.0f} | "
            f"{r['graph_vs_ort_fp32']:.2f}x | {r['short_p50_ms']:.2f} ms | {r['recall_at_10']:.1f} "
            f"| {r['mrr']:.1f} | {one} | {many} | {gain} | {ratio} | {indexing} "
            f"| {overhead} | {cooled} "
            f"| {first} | {memory} |"
        )
    auto = results.get("auto")
    if auto:
        lines += [
            "",
            f"With the defaults (HEADWISE_RUNTIME and HEADWISE_PRECISION auto) a server here "
            f"serves {auto['runtime']} {auto['precision']}: {auto['reason']}.",
        ]
    lines += ["", *(f"Not run: {s}." for s in results["skipped"]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
