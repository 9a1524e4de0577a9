"""The bundle folder: the only seam between export (torch) and the service (no torch).

BUNDLE/
  manifest.json       a `Manifest` (service/manifest.py): task, dims, pooling, per-graph sha256,
                      op counts, parity
  tokenizer.json      truncation at the model's max length, no padding
  encoder.onnx        fused serving graph: ids, mask -> sentence_embedding (or logits)
  attention.onnx      unfused debug graph: -> sentence_embedding, attentions (L, B, h, N, N)
  encoder.fp16.onnx   optional, for the GPU
  encoder.int8.onnx   optional, for the CPU
  *.onnx.data         a graph's weights, beside it, when they pass what one ONNX file holds
                      (2 GiB): ONNX Runtime reads them from the graph's folder

Every file the manifest lists, external data included, is checked against its sha256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from service.manifest import FORMAT_VERSION, GraphKey, Manifest

MANIFEST = "manifest.json"


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
    manifest: Manifest

    @property
    def tokenizer_path(self) -> Path:
        return self.root / self.manifest.tokenizer.file

    def has_graph(self, key: GraphKey) -> bool:
        return key in self.manifest.graphs

    def graph_path(self, key: GraphKey) -> Path:
        graphs = self.manifest.graphs
        if key not in graphs:
            raise BundleError(f"{self.root} has no {key!r} graph (it has: {', '.join(graphs)})")
        return self.root / graphs[key].file

    def vision_path(self, key: GraphKey) -> Path:
        """A graph of an image-text model's vision tower (Manifest.vision)."""
        vision = self.manifest.vision
        if vision is None or key not in vision.graphs:
            raise BundleError(f"{self.root} has no vision {key!r} graph")
        return self.root / vision.graphs[key].file

    def graph_bytes(self, keys: list[GraphKey] | None = None) -> int:
        """What the graphs (all, or those named) take on disk, external data included."""
        graphs = self.manifest.graphs
        return sum(g.total_bytes for k, g in graphs.items() if keys is None or k in keys)


def read_manifest(path: Path) -> Manifest:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from exc
    found = raw.get("format") if isinstance(raw, dict) else None
    if found != FORMAT_VERSION:
        raise BundleError(
            f"{path} has bundle format {found!r}; this headwise reads format {FORMAT_VERSION}: "
            "re-export the bundle with this version (headwise export)"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise BundleError(f"{path} is not a valid manifest: {problems}") from exc


def load_bundle(root: str | Path, verify: bool = True) -> Bundle:
    """Read the manifest and check every listed file exists and matches its sha256."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} not found: export a bundle first (headwise export --out {root})")
    manifest = read_manifest(path)
    for name, want in manifest.files().items():
        f = root / name
        if not f.is_file():
            raise BundleError(f"bundle file {f} is missing")
        if verify and (got := sha256_file(f)) != want:
            raise BundleError(
                f"bundle file {f} does not match its manifest: sha256 {got[:16]}… != {want[:16]}…"
                " (corrupt or tampered; re-export the bundle)"
            )
    return Bundle(root, manifest)
