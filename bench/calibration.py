"""python -m bench.calibration: how well a calibrated cost predicts batches it never ran.

For each model (the default bundle; random-weight ModernBERT and BERT checkpoints at their base
width, fewer layers: bench.families'; and, with the same few layers at the Hub models' widths, a
BERT cross-encoder reranker, a Qwen3-0.6B-shaped embedder (a decoder, last-token pooling) and
a bge-m3-shaped XLM-R large with its sparse and ColBERT heads: three outputs from one graph),
each serving session is calibrated exactly as warm-up
does it (service/engine/calibrate.py, the default budget), then timed on a grid of other
shapes, lengths 8 to the model's maximum (the long lane's past HEADWISE_LONG_TOKENS); the table
gives the predicted over the actual time at p50 and p90 of |error|, per session. A shape's
actual time is the median of PASSES passes over the grid, each a few runs of every shape (in
turn forwards and backwards): on a shared VM a burst slows every run for a second or more (a
1 ms shape moved by 35 % between two passes minutes apart), and one pass would charge it to
the prediction of whichever shapes it fell on. The JSON keeps every sample:
tests/service/engine/test_cost.py fits the recorded calibration again and holds its predictions
of the recorded grid to 25 % at p90.

The grid's time can drift from the calibration's as a whole (every shape of a session 17 %
slower a minute later, on a shared VM): a server follows it with the batches it serves
(service/engine/cost.py). So the table also gives the error once half the grid (every other
shape) has been served, on the other half (`after_serving`).

Writes bench/results/calibration.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.families import checkpoint, export
from bench.results_io import machine, save
from service.bundle import load_bundle
from service.engine.calibrate import measure, shapes
from service.engine.cost import CostModel, Sample
from service.engine.runtime import OnnxBackend
from service.settings import Settings
from service.tensors import Batch

log = logging.getLogger("calibration")
RESULTS = Path("bench/results")
MAIN_LENGTHS = (8, 12, 24, 48, 96, 160, 256, 384, 512, 768, 1024)
MAIN_ROWS = (1, 3, 8, 32, 64)
LONG_LENGTHS = (1100, 1536, 2048, 3072, 4096, 6144, 8192)
PASSES = 3


def timed(run: Any, rows: int, n: int, token: int) -> float:
    """One pass's time of a shape: the median of 3 to 5 runs (as many as fit in 0.2 s)."""
    ids = np.full((rows, n), token, dtype=np.int64)
    batch = Batch(ids, np.ones_like(ids))
    times: list[float] = []
    while len(times) < 3 or (len(times) < 5 and sum(times) < 0.2):  # short runs jitter
        started = time.perf_counter()
        run(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def actual(run: Any, plan: list[tuple[int, int]], token: int) -> list[Sample]:
    """Each shape's time: the median over PASSES passes of the plan (3 to 5 runs a pass)."""
    passes: dict[tuple[int, int], list[float]] = {shape: [] for shape in plan}
    for k in range(PASSES):
        for rows, n in plan if k % 2 == 0 else plan[::-1]:
            passes[(rows, n)].append(timed(run, rows, n, token))
    return [Sample(r, n, statistics.median(passes[(r, n)])) for r, n in plan]


def off(cost: CostModel, samples: list[Sample]) -> list[float]:
    """|predicted / actual - 1| of each sample."""
    return [abs(cost.seconds(x.rows, x.n) / x.seconds - 1) for x in samples]


def after_serving(record: dict[str, Any]) -> list[float]:
    """|error| of a recorded session's predictions once it has served every other shape of its
    grid (each observed as a batch that ran alone, then a refit, as the server does), on the
    shapes it did not serve."""
    cost = CostModel()
    cost.calibrate([Sample(*s) for s in record["calibration"]])
    held = [Sample(*s) for s in sorted(record["held_out"])]
    for x in held[0::2]:
        cost.observe(x.rows, x.n, x.seconds)
    cost.refit()
    return off(cost, held[1::2])


def grid(longest: int, shortest: int, long_lane: bool, s: Settings) -> list[tuple[int, int]]:
    if long_lane:
        return [(1, n) for n in LONG_LENGTHS if shortest < n <= longest]
    out = []
    for n in (*MAIN_LENGTHS, longest):
        for rows in MAIN_ROWS:
            if n <= longest and rows * n <= s.max_batch_tokens and rows <= s.max_batch_size:
                out.append((rows, n))
    return sorted(set(out))


def session(run: Any, longest: int, shortest: int, long_lane: bool, token: int, s: Settings) -> dict[str, Any]:
    started = time.monotonic()
    plan = shapes(longest, 1 if long_lane else s.max_batch_size)
    calibration = measure(run, plan, token, s.calibration_s)
    took = time.monotonic() - started
    cost = CostModel()
    cost.calibrate(calibration)
    held = actual(run, grid(longest, shortest, long_lane, s), token)
    errors = off(cost, held)
    return {
        "calibration": [[x.rows, x.n, x.seconds] for x in calibration],
        "calibration_s": took,
        "held_out": [[x.rows, x.n, x.seconds] for x in held],
        "p50_error": float(np.percentile(errors, 50)) if errors else None,
        "p90_error": float(np.percentile(errors, 90)) if errors else None,
        "lengths": [min(n for _, n in plan), longest],
    }


def other_checkpoint(kind: str, layers: int, folder: Path) -> Path:
    """A random-weight checkpoint of the rows beyond bench.families' encoders."""
    if (folder / "config.json").exists():
        return folder
    if kind == "bert-reranker":
        return checkpoint("bert-reranker", layers, folder)
    if kind == "qwen3-embedder":
        from bench.decoder import QWEN3_06B, build

        shape = {k: v for k, v in QWEN3_06B.items() if k != "vocab_size"}
        build(kind, folder, {**shape, "num_hidden_layers": layers}, "float32")
        return folder
    assert kind == "bge-m3", kind
    from bench.decoder import XLMR_LARGE
    from tests.conftest import build_tokenizer
    from tests.export.output_checkpoints import m3_checkpoint

    shape = {k: v for k, v in XLMR_LARGE.items() if k not in ("vocab_size", "type_vocab_size")}
    tokenizer = build_tokenizer("unigram", folder.parent / f"{folder.name}-tokenizer.json")
    shape |= {"num_hidden_layers": layers, "max_position_embeddings": 8194}
    return m3_checkpoint(folder, tokenizer, **shape)


def model(name: str, bundle: Path, s: Settings) -> dict[str, Any]:
    backend = OnnxBackend(load_bundle(bundle, verify=False), s)
    backend.warmup()
    m = backend.manifest
    token = m.vocab_size // 2
    lanes = {"main": session(backend.run, backend.long_tokens or m.max_length, 0, False, token, s)}
    if backend.long_tokens:
        lanes["long"] = session(backend.run_long, m.max_length, backend.long_tokens, True, token, s)
    log.info("%s: %s", name, {k: (v["p50_error"], v["p90_error"]) for k, v in lanes.items()})
    # What runs it here (the automatic choice: OpenVINO bf16 on a CPU with bf16 units).
    runs_on = f"{backend.info.runtime} {backend.info.precision}"
    return {"max_length": m.max_length, "lanes": lanes, "runs_on": runs_on}


def report(results: dict[str, Any]) -> str:
    lines = [
        "# Calibrated cost against batches it never ran",
        "",
        f"{results['machine']['cpus']} cores, flags: {results['machine']['cpu_flags']}; "
        f"{results['machine']['when']}. Calibration as warm-up does it (budget "
        f"{results['calibration_s']:g} s a session), then each shape of a grid timed (the median of "
        f"{PASSES} passes over the grid, each 3 to 5 runs of a shape) and predicted.",
        "",
        "| model | runs on | session | lengths served | longest measured | calibration took | shapes predicted | p50 error | p90 error | after serving half: p50 | p90 |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results["models"].items():
        for lane, v in r["lanes"].items():
            lo, hi = v["lengths"]
            later = after_serving(v)
            lines.append(
                f"| {name} | {r.get('runs_on', '')} | {lane} | {lo}-{hi} | "
                f"{max(c[1] for c in v['calibration'])} | "
                f"{v['calibration_s']:.1f} s | "
                f"{len(v['held_out'])} | {100 * v['p50_error']:.1f} % | {100 * v['p90_error']:.1f} % | "
                f"{100 * np.percentile(later, 50):.1f} % | {100 * np.percentile(later, 90):.1f} % |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    parser.add_argument(
        "--families", nargs="*", default=["modernbert", "bert", "nomic-bert", "gemma3", "deberta-v2"]
    )
    parser.add_argument(
        "--others", nargs="*", default=["bert-reranker", "qwen3-embedder", "bge-m3"],
        help="rows beyond the encoders: a reranker, a decoder, a multi-output model",
    )  # fmt: skip
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path("bundles/calibration"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    s = Settings(attention_enabled=False)
    models = {"all-MiniLM-L6-v2": model("all-MiniLM-L6-v2", args.bundle, s)}
    for family in args.families:
        folder = checkpoint(family, args.layers, args.root / f"{family}-ckpt")
        bundle = export(folder, args.root / family)
        models[f"{family} ({args.layers} layers)"] = model(family, bundle, s)
    for kind in args.others:
        folder = other_checkpoint(kind, args.layers, args.root / f"{kind}-ckpt")
        bundle = export(folder, args.root / kind)
        models[f"{kind} ({args.layers} layers)"] = model(kind, bundle, s)
    results = {"machine": machine(), "calibration_s": s.calibration_s, "models": models}
    save(args.out, "calibration", results, report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
