"""Decoders measured: a Qwen3-Embedding-shaped embedder and a Qwen3-Reranker-shaped causal LM
reranker (random weights, Qwen3-0.6B's widths at reduced depth), graph-direct docs/s against
HTTP docs/s, fp32 and int8 (where the export's gate allows it); and what exporting checkpoints
of the Hub's shapes takes (time, peak RSS, disk), a checkpoint past 2 GiB among them.

    python -m bench.decoder                 # 4 of Qwen3-0.6B's 28 layers; the Hub shapes
    python -m bench.decoder --tiny          # seconds: the smoke test's

Writes bench/results/decoder.{json,md} (or --out STEM). Checkpoints are built in processes of
their own (`python -m bench.decoder build ...`) and every folder is removed as it is done with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bench.children import run_measured
from bench.corpus import sentences
from bench.int8 import interleaved_rates
from bench.results_io import cpu_flags
from bench.server import get, launch
from service.manifest import Manifest
from service.pipelines.template import PairTemplate, with_tokenizer

log = logging.getLogger("bench")
GB = 1e9
QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151_936,
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "num_hidden_layers": 28,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "num_hidden_layers": 2,
}
XLMR_LARGE = {
    "vocab_size": 250_002,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "type_vocab_size": 1,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}
# The Hub models whose shapes the export section measures: (kind, shape, flags). Without
# --fp16: checking the fp16 graph on the CPU costs more RAM than the export itself (measured
# apart: it is the GPU's graph).
HUB = {
    "Qwen/Qwen3-Embedding-0.6B": ("qwen3-embedder", QWEN3_06B, ["--max-length", "8192"]),
    "Qwen/Qwen3-Reranker-0.6B": (
        "qwen3-reranker",
        QWEN3_06B,
        ["--task", "rerank", "--max-length", "8192"],
    ),
    "BAAI/bge-m3": ("xlmr", {**XLMR_LARGE, "max_position_embeddings": 8194}, []),
    "intfloat/multilingual-e5-large": ("xlmr", {**XLMR_LARGE, "max_position_embeddings": 514}, []),
}
QUERY = "How do I read a file line by line and strip the trailing newline?"


# --- checkpoints (built in a child process) ---------------------------------------------------


def build(kind: str, folder: Path, shape: dict, dtype: str) -> None:
    """A random-weight checkpoint of `kind` and `shape`, stored in `dtype` as the Hub has it."""
    import torch

    from tests.export.decoders import save, save_embedder

    text = sentences(4000, seed=1)  # its tokenizer learns the bench's language
    if kind == "qwen3-embedder":
        hf = save_embedder(folder, max_length=512, corpus=text, **shape)
    elif kind == "qwen3-reranker":
        hf = save(folder, "Qwen3ForCausalLM", "reranker", max_length=512, corpus=text, **shape)
    else:  # XLM-RoBERTa large (bge-m3, multilingual-e5-large)
        from tests.conftest import build_tokenizer
        from tests.models.checkpoints import save_checkpoint

        hf = save_checkpoint(folder, "XLMRobertaModel", "XLMRobertaConfig", **shape)
        build_tokenizer("unigram", folder / "tokenizer.json")
    if dtype != "float32":
        hf.to(getattr(torch, dtype)).save_pretrained(folder)


def build_child(kind: str, folder: Path, shape: dict, dtype: str) -> float:
    """build() in a process of its own; seconds it took."""
    t0 = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.decoder",
            "build",
            kind,
            str(folder),
            json.dumps(shape),
            dtype,
        ],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - t0


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def export_measured(folder: Path, out: Path, flags: list[str]) -> dict:
    """The CLI's export, its time and its own peak RSS, and what it wrote."""
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    run = run_measured(
        [sys.executable, "-m", "export.cli", "--model", str(folder), "--out", str(out), *flags], env
    )
    if run.returncode != 0:
        raise RuntimeError(f"export of {folder} failed: {run.stderr[-3000:]}")
    manifest = Manifest.model_validate_json((out / "manifest.json").read_text())
    checkpoint = sum(p.stat().st_size for p in folder.glob("model*.safetensors"))
    return {
        "seconds": round(run.seconds, 1),
        "peak_rss_bytes": run.peak_rss_bytes,
        "checkpoint_bytes": checkpoint,
        "peak_rss_x_checkpoint": round(run.peak_rss_bytes / checkpoint, 2),
        "bundle_bytes": folder_bytes(out),
        "graphs": {
            key: {"files": [g.file, *(d.file for d in g.data)], "bytes": g.total_bytes}
            for key, g in manifest.graphs.items()
        },
        "max_length": manifest.max_length,
    }


# --- serving ----------------------------------------------------------------------------------


def sequences(bundle: Path, manifest: Manifest, docs: list[str]) -> list[list[int]]:
    """The token ids the service computes for each doc (the reranker's through its template)."""
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    if manifest.rerank_template is None:
        return [e.ids for e in tok.encode_batch(docs)]
    template = PairTemplate(manifest.rerank_template, with_tokenizer(tok), manifest.max_length)
    return [s.ids for s in template.sequences([(QUERY, d) for d in docs])]


async def http_rate(
    url: str, bodies: list[tuple[str, dict, int]], concurrency: int
) -> tuple[float, int]:
    """Docs/s of `bodies` (path, JSON, docs in it) sent by `concurrency` clients, and how many
    times admission refused one (429: the client waits its Retry-After and sends it again, as
    the vendors' SDKs do)."""
    import httpx

    queue = list(bodies)
    refused = 0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def worker() -> None:
            nonlocal refused
            while queue:
                path, body, _ = queue.pop()
                while (r := await client.post(path, json=body)).status_code == 429:
                    refused += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", 1)))
                r.raise_for_status()

        await client.post(bodies[0][0], json=bodies[0][1])  # warm
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return sum(n for _, _, n in bodies) / (time.perf_counter() - t0), refused


def requests(docs: list[str], per_request: int) -> dict[str, list[tuple[str, dict, int]]]:
    groups = [docs[i : i + per_request] for i in range(0, len(docs), per_request)]
    return {
        "emb": [("/encode", {"inputs": g, "model": "emb"}, len(g)) for g in groups],
        "rr": [("/rerank", {"query": QUERY, "texts": g, "model": "rr"}, len(g)) for g in groups],
    }


def serve_section(
    work: Path,
    shape: dict,
    docs: list[str],
    concurrency: int,
    int8: bool = True,
    request_timeout: float | None = None,
) -> dict:
    out: dict = {}
    bundles = {}
    # int8 under the export's cosine floor alone: random weights retrieve nothing, so the
    # retrieval gate (--int8-pairs) would measure noise, node by node (minutes at this size).
    quantise = ["--int8"] if int8 else []
    for name, kind, flags in (
        ("emb", "qwen3-embedder", [*quantise, "--int8-pairs", "0"]),
        ("rr", "qwen3-reranker", ["--task", "rerank", *quantise]),
    ):
        folder, bundle = work / f"{name}-model", work / f"{name}-bundle"
        build_child(kind, folder, shape, "float32")
        export = export_measured(folder, bundle, flags)
        shutil.rmtree(folder)
        manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
        seqs = sequences(bundle, manifest, docs)
        graphs = [bundle / "encoder.onnx"]
        int8 = manifest.graphs.get("encoder_int8")
        if int8 is not None:
            graphs.append(bundle / int8.file)
        rates, _ = interleaved_rates(graphs, seqs, batch_size=16, rounds=2)
        out[name] = {
            "export": export,
            "tokens_per_doc": round(float(np.mean([len(s) for s in seqs])), 1),
            "graph_direct_docs_per_s": {"fp32": round(rates[0], 1)}
            | ({"int8": round(rates[1], 1)} if int8 is not None else {}),
            "int8": None
            if int8 is None
            else {
                "quantised": int8.quantised,
                "kept_fp32": len(int8.kept_fp32),
                "min_cosine": round(int8.parity.min_cosine, 5),
            },
        }
        bundles[name] = bundle
    specs = [f"{n}={b}" for n, b in bundles.items()]
    bodies = requests(docs, 16)
    for precision in ("fp32", "int8"):
        if precision == "int8" and not all(out[n]["int8"] for n in bundles):
            continue
        env = {"HEADWISE_PRECISION": precision, "HEADWISE_ATTENTION_ENABLED": "false"}
        if request_timeout is not None:
            env["HEADWISE_REQUEST_TIMEOUT_S"] = str(request_timeout)
        proc, url = launch(specs, env=env)
        try:
            for name in bundles:
                rate, refused = asyncio.run(http_rate(url, bodies[name], concurrency))
                out[name].setdefault("http_docs_per_s", {})[precision] = round(rate, 1)
                out[name].setdefault("http_refused_429", {})[precision] = refused
            memory = json.loads(get(f"{url}/info"))["memory"]
            out.setdefault("server_rss_bytes", {})[precision] = {
                "warm": memory["warm_bytes"],
                "peak": peak_rss(proc.pid),
                "models_graphs": memory["models_bytes"],
            }
        finally:
            proc.terminate()
            proc.wait(30)
    for bundle in bundles.values():
        shutil.rmtree(bundle)
    return out


def peak_rss(pid: int) -> int:
    """A live process's high-water mark of resident memory (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def export_section(work: Path, save: Callable[[dict], None]) -> dict:
    out: dict = {}
    for hub_id, (kind, shape, flags) in HUB.items():
        folder, bundle = work / "model", work / "bundle"
        dtype = "bfloat16" if kind.startswith("qwen3") else "float32"
        try:
            built = build_child(kind, folder, shape, dtype)
            log.info("%s: built in %.0f s, exporting", hub_id, built)
            out[hub_id] = {"dtype": dtype, "flags": flags, **export_measured(folder, bundle, flags)}
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            out[hub_id] = {"dtype": dtype, "flags": flags, "error": str(exc)[-2000:]}
        log.info("%s: %s", hub_id, out[hub_id])
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(bundle, ignore_errors=True)
        save(out)
    return out


# --- report -----------------------------------------------------------------------------------


def cpu() -> str:
    return f"{os.cpu_count()} cores, {cpu_flags()}"


def serve_table(r: dict) -> list[str]:
    lines = [
        "",
        "| model | tokens/doc | graph fp32 | HTTP fp32 | graph int8 | HTTP int8 | int8 nodes (kept fp32) | export s | export peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in (("emb", "embedder (last token)"), ("rr", "reranker (yes/no)")):
        m = r["serve"][name]
        g, h, i8 = m["graph_direct_docs_per_s"], m.get("http_docs_per_s", {}), m["int8"]
        nodes = f"{i8['quantised']} ({i8['kept_fp32']})" if i8 else "-"
        lines.append(
            f"| {label} | {m['tokens_per_doc']} | {g['fp32']} | {h.get('fp32', '-')} | "
            f"{g.get('int8', '-')} | {h.get('int8', '-')} | {nodes} | "
            f"{m['export']['seconds']} | {m['export']['peak_rss_bytes'] / GB:.2f} GB |"
        )
    refusals = {
        f"{name} {p}": n
        for name in ("emb", "rr")
        for p, n in r["serve"][name].get("http_refused_429", {}).items()
        if n
    }
    if refusals:
        lines += ["", "Refused by admission (429, then retried after Retry-After): " + ", ".join(
            f"{k}: {n}" for k, n in refusals.items())]  # fmt: skip
    rss = r["serve"].get("server_rss_bytes", {})
    if rss:
        lines += ["", "Server (both models, /attention off): " + "; ".join(
            f"{p}: warm {m['warm'] / GB:.2f} GB, peak {m['peak'] / GB:.2f} GB "
            f"(graphs {m['models_graphs'] / GB:.2f} GB)" for p, m in rss.items())]  # fmt: skip
    return lines


def render(r: dict) -> str:
    lines = [
        f"# Decoders ({r['mode']}, {r['layers']} layers)",
        "",
        f"CPU: {r['cpu']}. {r['docs']} docs (real sentences), 16 a request, "
        f"{r['concurrency']} clients; graph direct: length-sorted batches of 16.",
    ]
    if "serve" in r:
        lines += serve_table(r)
    if r.get("export"):
        lines += [
            "",
            "## Exports of the Hub's shapes (random weights)",
            "",
            "| model | checkpoint | flags | export | peak RSS | bundle on disk | graphs |",
            "|---|---|---|---|---|---|---|",
        ]
        for hub_id, e in r["export"].items():
            if "error" in e:
                lines.append(f"| {hub_id} | failed: {e['error'][-200:]} | | | | | |")
                continue
            graphs = "; ".join(
                f"{k}: {' + '.join(g['files'])} ({g['bytes'] / GB:.2f} GB)"
                for k, g in e["graphs"].items()
            )
            lines.append(
                f"| {hub_id} | {e['checkpoint_bytes'] / GB:.2f} GB {e['dtype']} | "
                f"{' '.join(e['flags']) or '-'} | {e['seconds']:.0f} s | "
                f"{e['peak_rss_bytes'] / GB:.2f} GB ({e['peak_rss_x_checkpoint']}x) | "
                f"{e['bundle_bytes'] / GB:.2f} GB | {graphs} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "build":
        _, kind, folder, shape, dtype = argv
        build(kind, Path(folder), json.loads(shape), dtype)
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.decoder")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, no Hub exports (smoke test)")
    p.add_argument("--layers", type=int, default=4, help="of Qwen3-0.6B's 28 (default 4)")
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--no-hub-exports", action="store_true", help="skip the Hub shapes' exports")
    p.add_argument("--no-serve", action="store_true", help="only the Hub shapes' exports")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="the server's HEADWISE_REQUEST_TIMEOUT_S (at 28 layers on 2 cores, 16 reranked "
        "documents take longer than the default 30 s deadline admits: 413)",
    )
    p.add_argument(
        "--no-int8",
        action="store_true",
        help="serve fp32 only (at 28 random layers int8 may miss the cosine floor, and the "
        "node-by-node search that follows quantises a 2.4 GB graph hundreds of times)",
    )
    p.add_argument("--out", type=Path, default=Path("bench/results/decoder"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    shape = dict(TINY) if args.tiny else {**QWEN3_06B, "num_hidden_layers": args.layers}
    docs = sentences(args.docs)
    result: dict = {
        "mode": "tiny shapes" if args.tiny else "Qwen3-0.6B's widths",
        "layers": shape["num_hidden_layers"],
        "cpu": cpu(),
        "docs": len(docs),
        "concurrency": args.concurrency,
        "request_timeout_s": args.request_timeout,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(part: dict | None = None, key: str = "export") -> None:
        if part is not None:
            result[key] = part
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="bench-decoder.") as tmp:
        work = Path(tmp)
        if not args.no_serve:
            timeout = args.request_timeout
            serve = serve_section(work, shape, docs, args.concurrency, not args.no_int8, timeout)
            save(serve, "serve")
        if not (args.tiny or args.no_hub_exports):
            save(export_section(work, save))
    table = render(result)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
