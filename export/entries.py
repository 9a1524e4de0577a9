"""A graph's manifest entry: its file (and external data files), their hashes, what it is."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, Unpack

from export import external
from service.bundle import sha256_file
from service.manifest import DataFile, GraphEntry, Parity, Precision, RetrievalQuality


class GraphExtras(TypedDict, total=False):
    """GraphEntry's fields that only some graphs set."""

    fused: bool
    unfused_reason: str | None
    kept_fp32: list[str]
    quantised: int | None
    quality: RetrievalQuality | None
    output_parity: dict[str, Parity]
    gated_parity: Parity | None


def graph_entry(
    path: Path,
    precision: Precision,
    counts: dict[str, int],
    parity: Parity,
    **extra: Unpack[GraphExtras],
) -> GraphEntry:
    data = [
        DataFile(file=f.name, sha256=sha256_file(f), bytes=f.stat().st_size)
        for f in external.data_files(path)
    ]
    return GraphEntry(
        file=path.name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        data=data,
        precision=precision,
        op_counts=counts,
        parity=parity,
        **extra,
    )
