"""The bundle folder: the only seam between export (torch) and the service (no torch).

BUNDLE/
  manifest.json       dims, heads, max length, pooling, per-graph sha256, op counts, parity
  tokenizer.json      truncation at the model's max length, no padding
  encoder.onnx        fused serving graph: ids, mask -> sentence_embedding (not normalised)
  attention.onnx      unfused debug graph: -> sentence_embedding, attentions (L, B, h, N, N)
  encoder.fp16.onnx   optional, for the GPU
  encoder.int8.onnx   optional, for the CPU
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class BundleError(RuntimeError):
    """The bundle is missing, incomplete or tampered with; the message names the file."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: dict[str, Any]

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def max_length(self) -> int:
        return int(self.manifest["max_length"])

    @property
    def d_model(self) -> int:
        return int(self.manifest["d_model"])

    @property
    def num_layers(self) -> int:
        return int(self.manifest["num_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.manifest["num_heads"])

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.manifest["tokenizer"]["file"]

    def has_graph(self, key: str) -> bool:
        return key in self.manifest["graphs"]

    def graph_path(self, key: str) -> Path:
        graphs = self.manifest["graphs"]
        if key not in graphs:
            raise BundleError(f"{self.root} has no {key!r} graph (it has: {', '.join(graphs)})")
        return self.root / graphs[key]["file"]


def files_of(manifest: dict[str, Any]) -> dict[str, str]:
    """file name -> sha256 for every file the manifest lists."""
    listed = {g["file"]: g["sha256"] for g in manifest["graphs"].values()}
    listed[manifest["tokenizer"]["file"]] = manifest["tokenizer"]["sha256"]
    return listed


def load_bundle(root: str | Path, verify: bool = True) -> Bundle:
    """Read the manifest and check every listed file exists and matches its sha256."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} not found: export a bundle first (headwise export --out {root})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BundleError(
            f"{path} has format {manifest.get('format')!r}; this headwise reads {FORMAT_VERSION}"
        )
    for name, want in files_of(manifest).items():
        f = root / name
        if not f.is_file():
            raise BundleError(f"bundle file {f} is missing")
        if verify and (got := sha256_file(f)) != want:
            raise BundleError(
                f"bundle file {f} does not match its manifest: sha256 {got[:16]}… != {want[:16]}…"
                " (corrupt or tampered; re-export the bundle)"
            )
    return Bundle(root, manifest)
