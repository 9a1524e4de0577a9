"""python -m bench.transports --bundle B: HTTP and gRPC side by side on one server, in one run.

One server with HEADWISE_GRPC_PORT; corpus sentences, one text a request, at 1 and 32 clients
over: HTTP `POST /embed` (TEI's route, the lean raw-socket load generator), gRPC
`tei.v1.Embed/Embed` and gRPC `inference.GRPCInferenceService/ModelInfer` (grpc.aio, one
channel, the calls multiplexed on it, as gRPC clients do). Rounds alternate the three so that a
shared machine's noise falls on all; the best round of each is kept. The graph called directly
on length-sorted batches of 32 of the same texts is the ceiling every row is a ratio to. The
clients run on the same cores as the server (grpc.aio's client costs more CPU a call than the
raw HTTP generator: part of a gRPC row's gap is the client's).

Writes bench/results/transports.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Any

import grpc
from tokenizers import Tokenizer

from bench import corpus
from bench.int8 import sessions_rates
from bench.loadgen import build_requests, run_load
from bench.results_io import machine, save
from bench.runtimes import session
from bench.server import free_port, launch
from service.api.oip.tensors import bytes_raw
from service.manifest import Manifest
from service.rpc.generated import grpc_predict_v2_pb2 as oip
from service.rpc.generated import grpc_predict_v2_pb2_grpc as oip_grpc
from service.rpc.generated import tei_pb2 as tei
from service.rpc.generated import tei_pb2_grpc as tei_grpc

log = logging.getLogger("bench")
RESULTS = Path("bench/results")
LOADS = ((1, 300), (32, 1500))
KINDS = ("http /embed", "grpc tei.v1.Embed", "grpc ModelInfer")


async def grpc_load(
    target: str, kind: str, model: str, texts: list[str], clients: int, total: int
) -> dict[str, float]:
    """`total` unary calls from `clients` coroutines on one channel: texts/s and p50."""
    counter = itertools.count()
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(target) as channel:
        embed, infer = tei_grpc.EmbedStub(channel), oip_grpc.GRPCInferenceServiceStub(channel)
        messages: list[Any] = []
        for text in texts:
            if kind == "grpc tei.v1.Embed":
                messages.append(tei.EmbedRequest(inputs=text))
            else:
                m = oip.ModelInferRequest(model_name=model)
                m.inputs.add(name="text", datatype="BYTES", shape=[1])
                m.raw_input_contents.append(bytes_raw([text.encode()]))
                messages.append(m)
        call = embed.Embed if kind == "grpc tei.v1.Embed" else infer.ModelInfer

        async def worker() -> None:
            nonlocal errors
            while (i := next(counter)) < total:
                t0 = time.perf_counter()
                try:
                    await call(messages[i % len(messages)])
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        seconds = time.perf_counter() - t0
    latencies.sort()
    p50 = latencies[len(latencies) // 2] if latencies else float("nan")
    return {"texts_per_s": total / seconds, "p50_ms": p50 * 1e3, "errors": errors}


def http_load(url: str, texts: list[str], clients: int, total: int) -> dict[str, float]:
    requests = build_requests(url, "/embed", texts)
    r = asyncio.run(run_load(url, requests, clients, total))
    return {"texts_per_s": r.rps, "p50_ms": r.percentile(50) * 1e3, "errors": r.errors}


def measure(
    bundle: Path, model: str, texts: list[str], rounds: int, scale: float = 1.0
) -> dict[str, Any]:
    port = free_port()
    proc, url = launch([f"{model}={bundle}"], env={"HEADWISE_GRPC_PORT": str(port)})
    target = f"127.0.0.1:{port}"
    best: dict[str, dict[str, dict[str, float]]] = {k: {} for k in KINDS}
    try:
        http_load(url, texts, 8, 200)  # warm: the first requests pay for allocations
        asyncio.run(grpc_load(target, KINDS[1], model, texts, 8, 200))
        for _ in range(rounds):
            for clients, full in LOADS:
                total = max(clients, round(full * scale))
                for kind in KINDS:
                    if kind.startswith("http"):
                        got = http_load(url, texts, clients, total)
                    else:
                        got = asyncio.run(grpc_load(target, kind, model, texts, clients, total))
                    key = str(clients)
                    if key not in best[kind] or got["texts_per_s"] > best[kind][key]["texts_per_s"]:
                        best[kind][key] = got
        return best
    finally:
        proc.terminate()
        proc.wait(30)


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    graph = results["graph_texts_per_s"]
    lines = [
        "# HTTP and gRPC",
        "",
        f"{m['cpus']} cores, flags: {m['cpu_flags']}; {m['when']}; {results['bundle']}; corpus "
        "sentences, one a request; clients on the same cores. The graph alone, batches of 32: "
        f"{graph:.0f} texts/s.",
        "",
        "| transport | clients | texts/s | / graph | p50 | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        for clients, _ in LOADS:
            r = results["runs"][kind][str(clients)]
            lines.append(
                f"| {kind} | {clients} | {r['texts_per_s']:.0f} | {r['texts_per_s'] / graph:.2f}x "
                f"| {r['p50_ms']:.2f} ms | {r['errors']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--scale", type=float, default=1.0, help="of the calls each load makes")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = Manifest.model_validate_json((args.bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    texts = corpus.sentences(args.texts)
    rates, _ = sessions_rates(
        [session(args.bundle, manifest, "onnxruntime", "fp32")],
        [e.ids for e in tok.encode_batch(texts)],
    )
    runs = measure(args.bundle, "m", texts, args.rounds, args.scale)
    results = {
        "machine": machine(),
        "bundle": manifest.name,
        "graph_texts_per_s": rates[0],
        "runs": runs,
    }
    save(args.out, "transports", results, report(results))


if __name__ == "__main__":
    main()
