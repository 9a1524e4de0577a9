"""python -m bench.outputs: what sparse and token-vector outputs cost beside the dense vector.

Two random-weight checkpoints of all-MiniLM-L6-v2's shape (BERT, d 384, 12 heads, its
tokenizer and 30,522-token vocabulary; `--layers` deep), exported by the CLI:

- bge-m3-shaped: the encoder with FlagEmbedding's sparse_linear and colbert_linear (d' = d);
  HTTP /encode docs/s asking dense, sparse, multi_vector, and all three (one forward pass);
- a BertForMaskedLM exported twice, as a dense embedder and with --task sparse (SPLADE): the
  same encoder, so docs/s dense vs SPLADE is the masked-LM head and its (B, N, V) logits; and
  the SPLADE graph called directly beside the time numpy takes to pick each row's nonzeros
  from its (B, V) output (why the graph outputs the pooled vector, not top-k);
- the bytes of a multi-vector answer, JSON floats vs base64 float32.

Writes bench/results/outputs.{json,md}. `--tiny`: a 2-layer, d 32 model, few rounds (CI).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.results_io import machine, save
from bench.server import exported, launch, stop

log = logging.getLogger("outputs")
RESULTS = Path("bench/results")
WIDE = {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536}
TINY = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}


def checkpoints(root: Path, layers: int, tiny: bool) -> tuple[Path, Path]:
    """(bge-m3-shaped folder, masked-LM folder)."""
    import torch
    import transformers

    from models.weights import default_model_dir

    values = {**(TINY if tiny else WIDE), "num_hidden_layers": layers, "vocab_size": 30522,
              "max_position_embeddings": 512}  # fmt: skip
    tokenizer = (default_model_dir() / "tokenizer.json").read_bytes()
    out = []
    for name, cls in (("m3", "BertModel"), ("mlm", "BertForMaskedLM")):
        folder = root / f"{name}-checkpoint"
        out.append(folder)
        if (folder / "config.json").exists():
            continue
        torch.manual_seed(0)
        model = getattr(transformers, cls)(transformers.BertConfig(**values)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.02)
        model.save_pretrained(folder)
        (folder / "tokenizer.json").write_bytes(tokenizer)
        if name == "m3":
            d = values["hidden_size"]
            torch.save(torch.nn.Linear(d, 1).state_dict(), folder / "sparse_linear.pt")
            torch.save(torch.nn.Linear(d, d).state_dict(), folder / "colbert_linear.pt")
    return out[0], out[1]


def export(folder: Path, out: Path, *flags: str) -> Path:
    if not exported(out):
        cmd = [sys.executable, "-m", "service.cli", "export", "--model", str(folder), "--out", str(out), *flags]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def text(n: int) -> str:
    """About n tokens of all-MiniLM's WordPiece (one word a token, [CLS] and [SEP] besides)."""
    words = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "rain", "fell", "over", "quiet", "city", "streets"]
    return " ".join(words[i % len(words)] for i in range(n - 2))


async def docs_per_s(url: str, body: dict[str, Any], rounds: int, clients: int = 2) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        r = await c.post("/encode", json=body)
        assert r.status_code == 200, r.text[:300]
        t0 = time.perf_counter()

        async def loop() -> None:
            for _ in range(rounds):
                r = await c.post("/encode", json=body)
                assert r.status_code == 200, r.text[:200]

        await asyncio.gather(*(loop() for _ in range(clients)))
        return clients * rounds * len(body["inputs"]) / (time.perf_counter() - t0)


def answer_bytes(url: str, model: str, inputs: list[str]) -> dict[str, int]:
    sizes = {}
    for fmt in ("float", "base64"):
        body = {"inputs": inputs, "model": model, "outputs": ["multi_vector"], "encoding_format": fmt}
        r = httpx.post(f"{url}/encode", json=body, timeout=600)
        assert r.status_code == 200, r.text[:300]
        sizes[fmt] = len(r.content)
    return sizes


def splade_graph(bundle: Path, rows: int, n: int, rounds: int) -> dict[str, float]:
    """The SPLADE graph called directly, and numpy's nonzero pick over its (B, V) output."""
    from service.engine.sessions import build_session

    session = build_session(bundle / "encoder.onnx", threads=0, spin=True)
    ids = np.random.default_rng(0).integers(1000, 20000, (rows, n)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    (out,) = session.run(["sparse_embedding"], feeds)
    t0 = time.perf_counter()
    for _ in range(rounds):
        session.run(["sparse_embedding"], feeds)
    graph_s = (time.perf_counter() - t0) / rounds
    t0 = time.perf_counter()
    for _ in range(rounds):
        for row in out:
            idx = np.flatnonzero(row)
            row[idx].astype(np.float32)
    pick_s = (time.perf_counter() - t0) / rounds
    return {"rows": rows, "tokens": n, "graph_ms": graph_s * 1e3, "nonzero_pick_ms": pick_s * 1e3,
            "output_mb": out.nbytes / 2**20, "nonzeros_per_row": float((out > 0).sum(1).mean()),
            "vocabulary": int(out.shape[1])}  # fmt: skip


def measure(root: Path, layers: int, rounds: int, tiny: bool) -> dict[str, Any]:
    m3_folder, mlm_folder = checkpoints(root, layers, tiny)
    m3 = export(m3_folder, root / "m3")
    dense = export(mlm_folder, root / "mlm-dense")
    splade = export(mlm_folder, root / "mlm-splade", "--task", "sparse")
    rows, n = (4, 16) if tiny else (16, 128)
    inputs = [text(n)] * rows
    env = {"HEADWISE_REQUEST_TIMEOUT_S": "600", "HEADWISE_ATTENTION_ENABLED": "false"}
    proc, url = launch([f"m3={m3}", f"dense={dense}", f"splade={splade}"], env)
    out: dict[str, Any] = {"rows": rows, "tokens": n}
    try:
        m3_rates = {}
        for name, outputs in (("dense", ["dense"]), ("sparse", ["sparse"]),
                              ("multi_vector", ["multi_vector"]),
                              ("all_three", ["dense", "sparse", "multi_vector"])):  # fmt: skip
            body = {"inputs": inputs, "model": "m3", "outputs": outputs}
            m3_rates[name] = asyncio.run(docs_per_s(url, body, rounds))
        out["m3_docs_per_s"] = m3_rates
        out["splade_docs_per_s"] = {
            "dense_same_encoder": asyncio.run(docs_per_s(url, {"inputs": inputs, "model": "dense"}, rounds)),
            "splade": asyncio.run(docs_per_s(url, {"inputs": inputs, "model": "splade"}, rounds)),
        }
        out["multi_vector_bytes"] = {
            f"{k}x{t}": answer_bytes(url, "m3", [text(t)] * k)
            for k, t in ((1, n), (rows, n), (1, 4 * n if not tiny else n))
        }
    finally:
        stop(proc)
    out["splade_graph"] = splade_graph(splade, rows, n, max(2, rounds // 2))
    return out


def report(r: dict[str, Any]) -> str:
    m3, sp, g = r["m3_docs_per_s"], r["splade_docs_per_s"], r["splade_graph"]
    lines = [
        f"headwise outputs · {r['layers']} layers, d {r['d_model']} · {r['cpus']} cores "
        f"({r['cpu_flags']}) · {r['when']}",
        "",
        f"HTTP /encode, {r['rows']} texts of {r['tokens']} tokens a request, 2 clients:",
        "",
        "| model | outputs | docs/s | vs dense |",
        "| --- | --- | ---: | ---: |",
    ]
    for name, rate in m3.items():
        lines.append(f"| bge-m3-shaped | {name} | {rate:.1f} | {rate / m3['dense']:.2f}x |")
    base = sp["dense_same_encoder"]
    lines.append(f"| masked LM as dense (mean) | dense | {base:.1f} | 1.00x |")
    lines.append(f"| masked LM as SPLADE | sparse | {sp['splade']:.1f} | {sp['splade'] / base:.2f}x |")
    lines += ["", "Multi-vector answer size (bytes):", "", "| texts x tokens | JSON | base64 | JSON/base64 |",
              "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for key, s in r["multi_vector_bytes"].items():
        lines.append(f"| {key} | {s['float']:,} | {s['base64']:,} | {s['float'] / s['base64']:.2f}x |")
    lines += [
        "",
        f"SPLADE graph direct, {g['rows']} x {g['tokens']} tokens: {g['graph_ms']:.1f} ms a batch; "
        f"picking each row's nonzeros from its (B, {g['vocabulary']}) output "
        f"({g['output_mb']:.1f} MB, {g['nonzeros_per_row']:.0f} nonzero a row): "
        f"{g['nonzero_pick_ms']:.2f} ms ({100 * g['nonzero_pick_ms'] / g['graph_ms']:.1f} % of the graph)",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.outputs")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help="2 layers, d 32, 2 rounds: the smoke test")
    p.add_argument("--root", type=Path, default=Path("bundles/outputs"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    layers, rounds = (2, 2) if args.tiny else (args.layers, args.rounds)
    args.root.mkdir(parents=True, exist_ok=True)
    results = {"layers": layers, "d_model": (TINY if args.tiny else WIDE)["hidden_size"],
               **machine(), **measure(args.root, layers, rounds, args.tiny)}  # fmt: skip
    save(args.out, "outputs", results, report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
