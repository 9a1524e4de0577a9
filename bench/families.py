"""python -m bench.families: today's encoders through headwise, per family.

For each family (BERT, ModernBERT, NomicBERT, EmbeddingGemma, DeBERTa-v3): a random-weight
checkpoint of the family's base width at reduced depth (`--layers`, all-MiniLM-L6-v2's
tokenizer), exported by the CLI (fused serving graph). Measured in one run, on one machine:

- docs/s at 128 and at 2,048 tokens: the fused graph called directly, the plain (unfused)
  graph called directly, and headwise HTTP /encode (a few concurrent clients);
- the memory of one 8,192-token request (the server's RSS high-water mark, before and after),
  for the families whose positions reach it;
- for ModernBERT, the p50 of 8 clients sending short texts while one 8,192-token input is
  answered, against the same clients on an idle server (the long lane's purpose).

Writes bench/results/families.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.results_io import save
from bench.server import exported, launch, stop

log = logging.getLogger("families")
RESULTS = Path("bench/results")

# family -> (transformers config class, model class, config values at the family's base width)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("BertConfig", "BertModel", {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512}),
    "modernbert": ("ModernBertConfig", "ModernBertModel", {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 1152, "max_position_embeddings": 8192, "global_attn_every_n_layers": 3, "local_attention": 128, "pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102, "cls_token_id": 101, "sep_token_id": 102}),
    "nomic-bert": ("NomicBertConfig", "NomicBertModel", {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 8192}),
    "gemma3": ("Gemma3TextConfig", "Gemma3TextModel", {"hidden_size": 768, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 1152, "max_position_embeddings": 2048, "sliding_window": 512, "use_bidirectional_attention": True, "pad_token_id": 0}),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0}),
}


# Not measured here (the families above are the encoders this bench serves over /encode): a
# cross-encoder reranker, one relevance logit, at BERT's width, for bench.calibration's rows.
RERANKERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert-reranker": ("BertConfig", "BertForSequenceClassification", {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512, "num_labels": 1}),
}


def checkpoint(family: str, layers: int, folder: Path) -> Path:
    import torch
    import transformers

    from models.weights import default_model_dir

    if (folder / "config.json").exists():
        return folder
    config_cls, model_cls, values = {**FAMILIES, **RERANKERS}[family]
    config = getattr(transformers, config_cls)(vocab_size=30522, num_hidden_layers=layers, **values)
    if family == "gemma3":  # every layer sliding but the last, as EmbeddingGemma's pattern
        config.layer_types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(folder)
    src = default_model_dir()
    (folder / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    positions = values["max_position_embeddings"]
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": positions}))
    return folder


def export(folder: Path, out: Path) -> Path:
    if not exported(out):
        cmd = [sys.executable, "-m", "service.cli", "export", "--model", str(folder), "--out", str(out)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def plain_graph(folder: Path, out: Path) -> Path:
    """The serving graph without fusion (what ONNX Runtime runs when nothing fuses)."""
    from export.onnx import export_serving
    from models.weights import load_pretrained

    if not out.exists():
        export_serving(load_pretrained(folder).model, out)
    return out


def ids(n: int, rows: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).integers(1000, 20000, (rows, n)).astype(np.int64)
    x[:, 0], x[:, -1] = 101, 102
    return {"input_ids": x, "attention_mask": np.ones_like(x)}


def graph_docs_per_s(path: Path, n: int, rows: int, rounds: int) -> float:
    from service.engine.sessions import build_session

    s = build_session(path, threads=0, spin=True)
    names = [i.name for i in s.get_inputs()]
    feeds = {k: v for k, v in ids(n, rows).items() if k in names}
    out = [s.get_outputs()[0].name]
    s.run(out, feeds)
    t0 = time.perf_counter()
    for _ in range(rounds):
        s.run(out, feeds)
    return rounds * rows / (time.perf_counter() - t0)


def text(n: int) -> str:
    """About n tokens of all-MiniLM's WordPiece (one word a token, [CLS] and [SEP] besides)."""
    return " ".join(["cat"] * (n - 2))


async def http_docs_per_s(url: str, n: int, rows: int, rounds: int, clients: int = 4) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        body = {"inputs": [text(n)] * rows}
        await c.post("/encode", json=body)
        t0 = time.perf_counter()

        async def loop() -> None:
            for _ in range(rounds):
                r = await c.post("/encode", json=body)
                assert r.status_code == 200, r.text[:200]

        await asyncio.gather(*(loop() for _ in range(clients)))
        return clients * rounds * rows / (time.perf_counter() - t0)


def hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def short_p50_ms(url: str, seconds: float, clients: int = 8) -> float:
    lat: list[float] = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def loop() -> None:
            while time.monotonic() < end:
                t0 = time.perf_counter()
                r = await c.post("/encode", json={"inputs": "a short text about cats"})
                if r.status_code == 200:
                    lat.append((time.perf_counter() - t0) * 1e3)

        await asyncio.gather(*(loop() for _ in range(clients)))
    return statistics.median(lat) if lat else float("nan")


async def long_beside_short(url: str, n: int) -> dict[str, float]:
    idle = await short_p50_ms(url, 5.0)
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        t0 = time.perf_counter()
        long = asyncio.ensure_future(c.post("/encode", json={"inputs": text(n)}))
        busy = await short_p50_ms(url, 5.0)
        r = await long
        took = time.perf_counter() - t0
    return {"short_p50_idle_ms": idle, "short_p50_beside_long_ms": busy, "ratio": busy / idle,
            "long_status": r.status_code, "long_s": took}


def measure(family: str, layers: int, root: Path, rounds: int) -> dict[str, Any]:
    folder = checkpoint(family, layers, root / f"{family}-checkpoint")
    bundle = export(folder, root / family)
    manifest = json.loads((bundle / "manifest.json").read_text())
    plain = plain_graph(folder, root / f"{family}-plain.onnx")
    out: dict[str, Any] = {
        "max_length": manifest["max_length"],
        "fused_ops": manifest["graphs"]["encoder"]["op_counts"],
        "fused": manifest["graphs"]["encoder"]["fused"],
    }
    lengths = [n for n in (128, 2048) if n <= manifest["max_length"]]
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "600", "HEADWISE_ATTENTION_ENABLED": "false"}
    proc, url = launch(bundle, env)
    try:
        for n in lengths:
            rows = 8 if n == 128 else 1
            r = max(2, rounds // (1 if n == 128 else 8))
            fused = graph_docs_per_s(bundle / "encoder.onnx", n, rows, r)
            unfused = graph_docs_per_s(plain, n, rows, r)
            http = asyncio.run(http_docs_per_s(url, n, rows, max(1, r // 4)))
            out[f"docs_per_s_{n}"] = {"fused": fused, "unfused": unfused, "http": http,
                                      "http_vs_graph": http / fused, "fused_vs_unfused": fused / unfused}
        if manifest["max_length"] >= 8192:
            before = hwm_mb(proc.pid)
            t0 = time.perf_counter()
            r = httpx.post(f"{url}/encode", json={"inputs": text(8192)}, timeout=600)
            out["long_8192"] = {"status": r.status_code, "seconds": time.perf_counter() - t0,
                                "rss_peak_before_mb": before, "rss_peak_after_mb": hwm_mb(proc.pid)}
            if family == "modernbert":
                out["long_beside_short"] = asyncio.run(long_beside_short(url, 8192))
    finally:
        stop(proc)
    return out


def report(results: dict[str, Any]) -> str:
    rows = ["| family | tokens | fused graph docs/s | unfused graph | fused/unfused | HTTP docs/s | HTTP/graph | fused ops |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for fam, r in results["families"].items():
        for n in (128, 2048):
            d = r.get(f"docs_per_s_{n}")
            if d:
                ops = ", ".join(f"{k} {v}" for k, v in r["fused_ops"].items() if k in ("Attention", "MultiHeadAttention", "RotaryEmbedding", "Softmax"))
                rows.append(f"| {fam} | {n} | {d['fused']:.1f} | {d['unfused']:.1f} | {d['fused_vs_unfused']:.2f}x | {d['http']:.1f} | {d['http_vs_graph']:.2f}x | {ops} |")
    lines = [f"headwise families · {results['layers']} layers each · {results['cpus']} cores · {results['when']}", "", *rows, ""]
    for fam, r in results["families"].items():
        if "long_8192" in r:
            x = r["long_8192"]
            lines.append(f"- {fam}: one 8,192-token /encode: {x['status']} in {x['seconds']:.1f} s, RSS high-water {x['rss_peak_before_mb']:.0f} -> {x['rss_peak_after_mb']:.0f} MB")
        if "long_beside_short" in r:
            x = r["long_beside_short"]
            lines.append(f"- {fam}: 8 short-text clients' p50 beside an 8,192-token input: {x['short_p50_beside_long_ms']:.1f} ms vs {x['short_p50_idle_ms']:.1f} ms idle = {x['ratio']:.2f}x (goal <= 2x)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.families")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--root", type=Path, default=Path("bundles/families"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"layers": args.layers, "cpus": os.cpu_count(),
                               "when": time.strftime("%Y-%m-%d %H:%M"), "families": {}}
    for fam in args.families:
        log.info("%s", fam)
        results["families"][fam] = measure(fam, args.layers, args.root, args.rounds)
    save(args.out, "families", results, report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
