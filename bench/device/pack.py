"""python -m bench.device.pack BUNDLE OUT | --unpack PACKED OUT: a bundle's fused encoder small
enough to travel to a lent machine (tens of MiB), and back into a bundle there.

pack: every float32 weight of 4,096 values or more rounded to int8 per row (a scale a row), the
graph without them (skeleton.onnx), the rows and scales (weights.npz), the tokenizer and a
manifest listing the encoder alone. unpack: the same graph with the rounded weights in float32,
its manifest's sha256 and size made to match. The model served there is the bundle's with
int8-rounded weights (all-MiniLM-L6-v2: cosine 0.997 or more to its real embeddings), computed in
whatever precision the runtime is asked for: fit for speed and for comparing precisions, not for
the real model's retrieval figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

SMALLEST = 4096  # values: smaller tensors (biases, norms) travel as they are


def pack(bundle: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(bundle / "encoder.onnx"))
    arrays: dict[str, np.ndarray] = {}
    for i, init in enumerate(model.graph.initializer):
        a = numpy_helper.to_array(init)
        if a.dtype != np.float32 or a.size < SMALLEST or a.ndim < 2:
            continue
        rows = a.reshape(-1, a.shape[-1])
        scale = (np.abs(rows).max(axis=1) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        arrays[f"q{i}"] = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8)
        arrays[f"s{i}"] = scale
        init.ClearField("raw_data")
        init.ClearField("float_data")
    onnx.save(model, str(out / "skeleton.onnx"))
    np.savez(out / "weights.npz", **arrays)
    shutil.copy(bundle / "tokenizer.json", out / "tokenizer.json")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["graphs"] = {"encoder": manifest["graphs"]["encoder"]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return len(arrays) // 2


def unpack(packed: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(packed / "skeleton.onnx"))
    weights = np.load(packed / "weights.npz")
    for i, init in enumerate(model.graph.initializer):
        if f"q{i}" in weights:
            a = weights[f"q{i}"].astype(np.float32) * weights[f"s{i}"][:, None]
            init.raw_data = a.astype(np.float32).reshape(tuple(init.dims)).tobytes()
    onnx.save(model, str(out / "encoder.onnx"))
    shutil.copy(packed / "tokenizer.json", out / "tokenizer.json")
    manifest = json.loads((packed / "manifest.json").read_text())
    for entry in [manifest["tokenizer"], *manifest["graphs"].values()]:
        f = out / entry["file"]
        entry["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
        if "bytes" in entry:
            entry["bytes"] = f.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="a bundle (or, with --unpack, a packed folder)")
    p.add_argument("out", type=Path)
    p.add_argument("--unpack", action="store_true")
    args = p.parse_args()
    if args.unpack:
        unpack(args.source, args.out)
    else:
        pack(args.source, args.out)


if __name__ == "__main__":
    main()
