"""python -m bench.arena --bundle B: ONNX Runtime memory configurations, RSS against speed.

Each configuration runs in its own process (RSS is per process): the graph is loaded, run on a
ramp of shapes up to the largest the server allows, then idle; RSS is read after each step.
Speed is measured on the shapes a server runs most (length-sorted batches) in the same process,
so the ratios between configurations come from one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from service.engine.memory import peak_rss_bytes, rss_bytes
from service.engine.sessions import build_session, run_options

CONFIGS = ("arena", "shrink", "off")
SPEED_SHAPES = ((32, 16), (16, 64), (4, 256))
RAMP = ((2, 8), (64, 64), (64, 256), (32, 256), (8, 32), (64, 256))


def _feeds(session, batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.full((batch, seq), 1000, dtype=np.int64)
    out = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    names = [i.name for i in session.get_inputs()]
    if "token_type_ids" in names:
        out["token_type_ids"] = np.zeros_like(ids)
    return {n: out[n] for n in names}


def measure(graph: Path, config: str, seconds: float) -> dict:
    session = build_session(graph, threads=0, spin=True, arena=config != "off")
    opts = run_options(config)
    out = [o.name for o in session.get_outputs()][:1]
    rss = {"loaded": rss_bytes()}
    for b, n in RAMP:
        session.run(out, _feeds(session, b, n), opts)
        rss[f"after {b}x{n}"] = rss_bytes()
        if (b, n) == RAMP[2]:
            rss[f"peak during {b}x{n}"] = peak_rss_bytes()
    speed = {}
    for b, n in SPEED_SHAPES:
        feeds = _feeds(session, b, n)
        session.run(out, feeds, opts)
        runs, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            session.run(out, feeds, opts)
            runs += 1
        speed[f"{b}x{n}"] = runs * b / (time.perf_counter() - t0)
    rss["end"] = rss_bytes()
    return {"config": config, "rss_mb": {k: v / 2**20 for k, v in rss.items()}, "texts_per_s": speed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.arena")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--graph", default="encoder.onnx")
    p.add_argument("--seconds", type=float, default=3.0, help="per speed shape")
    p.add_argument("--rounds", type=int, default=2, help="interleaved repeats of every config")
    p.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    graph = args.bundle / args.graph
    if args.one:
        print(json.dumps(measure(graph, args.one, args.seconds)))  # noqa: T201 - to the parent
        return 0
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for _ in range(args.rounds):  # interleaved, so a noisy neighbour hits every config alike
        for config in CONFIGS:
            cmd = [sys.executable, "-m", "bench.arena", "--bundle", str(args.bundle),
                   "--graph", args.graph, "--seconds", str(args.seconds), "--one", config]
            results[config].append(json.loads(subprocess.check_output(cmd)))
    base = {s: max(r["texts_per_s"][s] for r in results["arena"]) for s, _ in _shape_keys()}
    for config, runs in results.items():
        rss = {k: max(r["rss_mb"][k] for r in runs) for k in runs[0]["rss_mb"]}
        speed = {s: max(r["texts_per_s"][s] for r in runs) for s, _ in _shape_keys()}
        ratios = " ".join(f"{s} {speed[s]:.0f}/s ({speed[s] / base[s]:.2f}x)" for s in speed)
        steps = " ".join(f"{k}={v:.0f}" for k, v in rss.items())
        print(f"{config:7s} RSS MB: {steps}\n        speed (best of {args.rounds}): {ratios}")  # noqa: T201
    return 0


def _shape_keys():
    return [(f"{b}x{n}", (b, n)) for b, n in SPEED_SHAPES]


if __name__ == "__main__":
    sys.exit(main())
