"""`make gpu-check`: the GPU path in one command, for the first machine with an NVIDIA GPU.

python -m bench.gpu --bundle B [--json FILE] [--dry-run]

In an environment with onnxruntime-gpu and a bundle exported with --fp16:
1. parity on CUDA: the fp32 and fp16 graphs on CUDA against the fp32 graph on the CPU, min and
   mean cosine over the benchmark corpus (refuses to go on when they are off);
2. the graph called directly on a batch x length grid, plain `run` and with IO binding (inputs
   copied once to the device, outputs left there);
3. HTTP: `headwise serve` on CUDA (fp16), one text per request at 1/32/256 clients, and 32 texts
   per request;
4. GPU memory (nvidia-smi: the device and the server process);
then writes JSON and a markdown table (bench/results/gpu.json, gpu.md) for the README.

--dry-run runs every step but the CUDA ones, on the CPU provider with a small grid and few
requests, so that CI keeps the script working where no GPU is (tests/bench runs it).
Needs neither torch nor the export extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench import baselines, corpus
from bench.loadgen import build_requests, run_load
from bench.server import launch
from service.bundle import load_bundle
from service.engine.sessions import CPU, CUDA, build_session
from service.tensors import cosines

log = logging.getLogger("bench.gpu")

# The export gates, applied to the same graphs on another device (export/verify.py's values).
MIN_COSINE = {"encoder": 0.99999, "encoder_fp16": 0.999}
GRID = {"batch": [1, 8, 32, 128], "length": [16, 64, 128, 256]}
DRY_GRID = {"batch": [1, 4], "length": [8, 16]}


class ParityError(RuntimeError):
    """A graph on the device disagrees with the CPU's fp32 graph."""


def embed(s: ort.InferenceSession, sequences: list[list[int]], batch: int = 32) -> np.ndarray:
    out = []
    for i in range(0, len(sequences), batch):
        ids, mask = baselines.padded(sequences[i : i + batch])
        out.append(s.run(None, {"input_ids": ids, "attention_mask": mask})[0])
    return np.concatenate(out)


def parity(bundle, sequences: list[list[int]], providers: list[str], dry: bool) -> dict:
    want = embed(build_session(bundle.graph_path("encoder")), sequences)
    out = {}
    for key in ("encoder", "encoder_fp16"):
        if not bundle.has_graph(key):
            raise ParityError(f"bundle has no {key}: export it with --fp16")
        if dry and key == "encoder_fp16":
            out[key] = {"skipped": "fp16 runs on CUDA only"}
            continue
        s = build_session(bundle.graph_path(key), providers)
        if s.get_providers()[0] != providers[0]:  # ORT falls back to the CPU with a log line
            raise ParityError(
                f"{key}: {providers[0]} did not start (session runs on {s.get_providers()}): "
                "CUDA/cuDNN libraries missing or not matching this onnxruntime-gpu; "
                "pip install 'onnxruntime-gpu[cuda,cudnn]' brings matching ones"
            )
        cos = cosines(embed(s, sequences), want)
        out[key] = {
            "providers": s.get_providers(),
            "min_cosine": float(cos.min()),
            "mean_cosine": float(cos.mean()),
        }
        if not cos.min() >= MIN_COSINE[key]:
            raise ParityError(f"{key} on {providers[0]}: min cosine {cos.min():.6f} vs CPU fp32")
    return out


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def graph_grid(path: Path, providers: list[str], grid: dict, repeats: int) -> list[dict]:
    """Median ms per call and texts/s per (batch, length), plain run and with IO binding."""
    s = build_session(path, providers)
    device = "cuda" if providers[0] == CUDA else "cpu"
    output = s.get_outputs()[0].name
    rows = []
    for b in grid["batch"]:
        for n in grid["length"]:
            ids = np.full((b, n), 1000, dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            plain = _time(lambda f=feeds: s.run([output], f), repeats)
            io = s.io_binding()
            for name, value in feeds.items():
                io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
            io.bind_output(output, device)

            def bound(io=io):
                s.run_with_iobinding(io)
                io.synchronize_outputs()

            binding = _time(bound, repeats)
            rows.append(
                {
                    "batch": b,
                    "length": n,
                    "run_ms": plain * 1e3,
                    "iobinding_ms": binding * 1e3,
                    "texts_per_s": b / plain,
                    "iobinding_texts_per_s": b / binding,
                }
            )
            log.info("graph %dx%d: %.3f ms, IO binding %.3f ms", b, n, plain * 1e3, binding * 1e3)
    return rows


def gpu_memory(pid: int | None = None) -> dict | None:
    """The device's used/total MiB and, when `pid` is given, that process's (nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return None

    def query(*args: str) -> list[list[str]]:
        text = subprocess.run(
            ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return [[c.strip() for c in line.split(",")] for line in text.strip().splitlines()]

    name, driver, used, total = query("--query-gpu=name,driver_version,memory.used,memory.total")[0]
    out = {"gpu": name, "driver": driver, "used_mib": int(used), "total_mib": int(total)}
    if pid is not None:
        apps = query("--query-compute-apps=pid,used_memory")
        out["server_mib"] = next((int(m) for p, m in apps if p == str(pid)), None)
    return out


def http(bundle: Path, texts: list[str], env: dict, clients: list[int], total: int) -> dict:
    proc, url = launch(bundle, {"HEADWISE_ATTENTION_ENABLED": "false", **env})
    runs = []
    try:
        for per_request, levels in ((1, clients), (32, [max(1, clients[-1] // 32)])):
            requests = build_requests(url, "/encode", texts, per_request=per_request)
            n = total if per_request == 1 else max(8, total // 8)
            for c in levels:
                asyncio.run(run_load(url, requests, c, min(n, 64)))
                r = asyncio.run(run_load(url, requests, c, n))
                runs.append(
                    {
                        "texts_per_request": per_request,
                        "clients": c,
                        "requests": r.requests,
                        "errors": r.errors,
                        "texts_per_s": r.rps * per_request,
                        "p50_ms": r.percentile(50) * 1e3,
                        "p99_ms": r.percentile(99) * 1e3,
                    }
                )
                log.info(
                    "HTTP %d text(s)/request, %d clients: %.0f texts/s",
                    per_request,
                    c,
                    runs[-1]["texts_per_s"],
                )
        memory = gpu_memory(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    return {"runs": runs, "memory": memory}


def render(r: dict) -> str:
    mode = "DRY RUN on the CPU (no CUDA step ran)" if r["dry_run"] else r["device"]
    lines = [f"headwise gpu-check · {r['model']} · {mode} · onnxruntime {r['onnxruntime']}", ""]
    lines += [
        "| graph | providers | min cosine vs CPU fp32 | mean |",
        "| --- | --- | ---: | ---: |",
    ]
    for key, p in r["parity"].items():
        if "skipped" in p:
            lines.append(f"| {key} | - | skipped: {p['skipped']} | - |")
        else:
            lines.append(
                f"| {key} | {p['providers'][0]} | {p['min_cosine']:.6f} | {p['mean_cosine']:.6f} |"
            )
    lines += [
        "",
        "| graph | batch x length | ms/call | with IO binding | texts/s | with IO binding |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for key, rows in r["graph"].items():
        for g in rows:
            lines.append(
                f"| {key} | {g['batch']} x {g['length']} | {g['run_ms']:.3f} | {g['iobinding_ms']:.3f} | "
                f"{g['texts_per_s']:.0f} | {g['iobinding_texts_per_s']:.0f} |"
            )
    lines += [
        "",
        f"HTTP /encode, server on {r['http']['precision']}:",
        "",
        "| texts/request | clients | texts/s | p50 ms | p99 ms | errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for h in r["http"]["runs"]:
        lines.append(
            f"| {h['texts_per_request']} | {h['clients']} | {h['texts_per_s']:.0f} | {h['p50_ms']:.2f} | {h['p99_ms']:.2f} | {h['errors']} |"
        )
    m = r["http"]["memory"]
    lines += [
        "",
        f"GPU memory: {m['used_mib']} of {m['total_mib']} MiB used, server process {m.get('server_mib')} MiB ({m['gpu']}, driver {m['driver']})"
        if m
        else "GPU memory: n/a (no nvidia-smi)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu")
    p.add_argument("--bundle", type=Path, default=Path("bundles/gpu"))
    p.add_argument("--json", type=Path, default=Path("bench/results/gpu.json"))
    p.add_argument("--texts", type=int, default=512)
    p.add_argument("--requests", type=int, default=2048, help="requests per HTTP level")
    p.add_argument(
        "--dry-run", action="store_true", help="every step but the CUDA ones, on the CPU"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dry = args.dry_run
    available = ort.get_available_providers()
    if not dry and CUDA not in available:
        log.error(
            "no CUDA provider in this onnxruntime (%s): install onnxruntime-gpu, or --dry-run",
            available,
        )
        return 2
    providers = [CPU] if dry else [CUDA, CPU]
    if not dry and hasattr(ort, "preload_dlls"):
        # CUDA and cuDNN from the nvidia-* wheels of onnxruntime-gpu[cuda,cudnn], when there;
        # a system CUDA on the library path serves as well.
        ort.preload_dlls()
    bundle = load_bundle(args.bundle)
    texts = corpus.sentences(64 if dry else args.texts)
    sequences = baselines.tokenize(args.bundle / "tokenizer.json", texts)
    results: dict = {
        "dry_run": dry,
        "model": bundle.manifest.name,
        "onnxruntime": ort.__version__,
        "providers_available": available,
        "device": (gpu_memory() or {}).get("gpu", "cpu") if not dry else "cpu",
        "python": platform.python_version(),
        "corpus": {"texts": len(texts), "sha": corpus.fingerprint(texts)},
    }
    log.info("parity on %s …", providers[0])
    try:
        results["parity"] = parity(bundle, sequences, providers, dry)
    except ParityError as exc:
        log.error("%s", exc)
        return 1
    grid = DRY_GRID if dry else GRID
    keys = ["encoder"] if dry else ["encoder", "encoder_fp16"]
    results["graph"] = {
        k: graph_grid(bundle.graph_path(k), providers, grid, 3 if dry else 50) for k in keys
    }
    env = (
        {"HEADWISE_DEVICE": "cpu", "HEADWISE_PRECISION": "fp32"}
        if dry
        else {"HEADWISE_DEVICE": "cuda", "HEADWISE_PRECISION": "fp16"}
    )
    clients = [1, 4] if dry else [1, 32, 256]
    results["http"] = {
        "precision": env["HEADWISE_PRECISION"],
        **http(args.bundle, texts, env, clients, 40 if dry else args.requests),
    }
    table = render(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    args.json.with_suffix(".md").write_text(table + "\n")
    print(table)  # noqa: T201 - the table is the program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
