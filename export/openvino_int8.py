"""OpenVINO's int8 graph of an embedding model: NNCF's post-training quantisation of the fused
serving graph, judged by the same retrieval gate as ONNX Runtime's int8.

OpenVINO cannot read the bundle's `encoder.int8.onnx` (ONNX Runtime's `QAttention` has no
conversion rule in OpenVINO 2026.4), so its int8 graph is its own: NNCF reads the fp32 fused
graph through OpenVINO, inserts FakeQuantize nodes with scales from calibration texts (its
transformer preset: SmoothQuant, and the attention's softmax and norms kept in float), and
writes OpenVINO's IR (`encoder.int8.openvino.xml` and its weights, `.bin`). OpenVINO compiles it
to its CPU plugin's int8 kernels: VNNI and AMX's int8 units where the CPU has them.

The calibration texts are held-out docstring pairs that neither the gate nor bench.runtimes's
retrieval measures (`quality.docstring_pairs("holdout")` past its first 1,000); where the Python
that exports has fewer (a slim image's standard library), the last CALIBRATION_PAIRS of them,
which bench.runtimes's check would share but the gate does not. The graph ships
only when its vectors stay near fp32's on the probe batch (cosine `verify.INT8_MIN_COSINE`) and
recall@10 and MRR stay within the gate's points of the fp32 graph's on the gate's pairs; where
every MatMul in int8 does not, the FFNs' projections are kept in float32 in turn (LADDER), as
ONNX Runtime's int8 search keeps its worst nodes; else it is left out, with the figures in the
log. Embedding models only (the gate is retrieval).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from export import verify
from service.bundle import sha256_file
from service.engine import openvino_session, quality
from service.engine.openvino_session import OpenVinoSession
from service.engine.sessions import build_session
from service.manifest import DataFile, GraphEntry, Parity, RetrievalQuality
from service.tensors import Batch

log = logging.getLogger(__name__)

XML = "encoder.int8.openvino.xml"
CALIBRATION_FROM = 1000  # holdout pairs before this are bench.runtimes's retrieval check
CALIBRATION_PAIRS = 40  # at least this many held-out pairs calibrate (80 texts)
CALIBRATION_BATCH = 8


def available() -> str | None:
    """Why OpenVINO's int8 cannot be made here, or None when it can."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install openvino nncf)"
    return None


def calibration_feeds(tok: Tokenizer, inputs: list[str], pad_id: int) -> list[dict[str, Any]]:
    """Padded batches of the calibration texts, fed as the serving graph takes them."""
    pairs = quality.docstring_pairs("holdout")
    start = calibration_start(len(pairs.queries))
    if start < CALIBRATION_FROM:
        log.info(
            "OpenVINO int8 calibrates on held-out pairs %d-%d: this Python's standard library has "
            "%d (bench.runtimes measures the first %d)",
            start,
            len(pairs.queries),
            len(pairs.queries),
            CALIBRATION_FROM,
        )
    texts = pairs.queries[start:] + pairs.documents[start:]
    feeds = []
    for i in range(0, len(texts), CALIBRATION_BATCH):
        ids = [e.ids for e in tok.encode_batch(texts[i : i + CALIBRATION_BATCH])]
        feeds.append(Batch.of(ids, pad_id).feeds(inputs))
    return feeds


def calibration_start(held_out: int) -> int:
    """The first held-out pair that calibrates: CALIBRATION_FROM, or earlier where fewer than
    CALIBRATION_PAIRS lie past it (NNCF refuses an empty calibration set)."""
    return max(0, min(CALIBRATION_FROM, held_out - CALIBRATION_PAIRS))


# What stays in float32, tried in turn until the gate passes: nothing; the FFNs' output
# projections (fc2: after the activation, where a transformer's activation outliers are);
# both FFN projections. Measured on all-MiniLM-L6-v2 (1,000 gate pairs): every MatMul int8 lost
# 1.0 point of recall@10; fc2 kept, 0.5 of MRR (just past the gate); fc1 and fc2 kept, 0.2 / 0.3.
LADDER: tuple[tuple[str, ...], ...] = ((), ("/ffn/fc2/",), ("/ffn/fc1/", "/ffn/fc2/"))


def quantize(
    fused: Path,
    out_dir: Path,
    tok: Tokenizer,
    pad_id: int,
    feeds: dict[str, np.ndarray],
    fp32: np.ndarray,
    gate: quality.RetrievalGate,
    probe: Batch,
) -> GraphEntry | None:
    """The int8 IR beside `fused` in `out_dir` and its manifest entry: the first step of LADDER
    whose graph keeps the probe texts' cosine, agrees with ONNX Runtime's fp32 graph on every
    output as a server's start demands (`probe`: openvino_session.probe_of; on a VNNI CPU
    every MatMul in int8 moved a token state to cosine 0.949, which a server refused), and
    passes the retrieval gate; None (logged) when none does."""
    import nncf
    import openvino

    path = out_dir / XML
    core = openvino.Core()
    inputs = [port.get_any_name() for port in core.read_model(str(fused)).inputs]
    texts = {k: v for k, v in feeds.items() if k in inputs}
    reference = build_session(fused)  # what a server's start compares it with
    data = calibration_feeds(tok, inputs, pad_id)
    fails: list[str] = []
    for kept in LADDER:
        # A fresh read each time: NNCF keys nodes by the names a read gives them.
        model = core.read_model(str(fused))
        names = [
            op.get_friendly_name()
            for op in model.get_ops()
            if op.get_type_name() == "MatMul" and any(k in op.get_friendly_name() for k in kept)
        ]
        quantized = nncf.quantize(
            model,
            nncf.Dataset(data),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(data),
            ignored_scope=nncf.IgnoredScope(names=names) if names else None,
        )
        openvino.save_model(quantized, str(path))  # compress_to_fp16 is for fp32 weights only
        session = OpenVinoSession(path, "int8")  # compiled once: the probe's and the gate's
        got = session.run([session.get_outputs()[0].name], texts)[0]
        parity = verify.compare_outputs("encoder.onnx", got, fp32, "embed")
        step = f"{len(names)} MatMul kept fp32"
        # The cheap checks first: the gate's 2,000 texts are not run for a step that fails them.
        if parity.min_cosine < verify.INT8_MIN_COSINE:
            fails.append(f"{step}: probe cosine {parity.min_cosine:.4f} < {verify.INT8_MIN_COSINE}")
        elif why := openvino_session.disagreement(session, reference, probe, "int8"):
            fails.append(f"{step}: {why}")
        elif not quality.within(q := gate.measure(path, session), gate.max_drop, gate.min_spearman):
            fails.append(f"{step}: {quality.summary(q)}")
        else:
            return _entry(path, quantized, parity, q, names)
        log.info("OpenVINO int8 with %s", fails[-1])
    log.warning("OpenVINO int8 left out: no step passes (%s)", "; ".join(fails))
    path.unlink()
    path.with_suffix(".bin").unlink(missing_ok=True)
    return None


def _entry(
    path: Path, quantized: Any, parity: Parity, q: RetrievalQuality, kept: list[str]
) -> GraphEntry:
    counts = dict(Counter(op.get_type_name() for op in quantized.get_ops()))
    fake = counts.get("FakeQuantize", 0)
    log.info(
        "OpenVINO int8 (NNCF, %d FakeQuantize, %d MatMul kept fp32): probe cosine >= %.4f; %s",
        fake,
        len(kept),
        parity.min_cosine,
        quality.summary(q),
    )
    weights = path.with_suffix(".bin")
    return GraphEntry(
        file=path.name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        data=[
            DataFile(file=weights.name, sha256=sha256_file(weights), bytes=weights.stat().st_size)
        ],
        precision="int8",
        op_counts=counts,
        parity=parity,
        kept_fp32=kept,
        quantised=fake,
        quality=q,
    )
