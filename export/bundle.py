"""Build a bundle folder: export, fuse, gate on fusion and parity, then write the manifest."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from export import optimize, verify
from export.onnx import OPSET, export_attention, export_serving
from models.weights import LoadedModel
from service.bundle import MANIFEST, sha256_file
from service.manifest import FileEntry, GraphEntry, Manifest, Precision, Source, SpecialTokens
from service.sessions import build_session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOptions:
    fp16: bool = False
    int8: bool = False
    int8_min_cosine: float = verify.INT8_TARGET_COSINE


def write_tokenizer(loaded: LoadedModel, out: Path) -> Tokenizer:
    """The model's tokenizer with truncation at the model's max length and no fixed padding.

    Shipped tokenizer.json files often bake in other values (all-MiniLM-L6-v2: truncation and
    fixed padding at 128, while the model was trained to 256); the bundle states the right one.
    """
    tok = Tokenizer.from_file(str(loaded.tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(max_length=loaded.max_length)
    tok.save(str(out))
    return tok


def _run(path: Path, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    return build_session(path).run(None, {"input_ids": ids, "attention_mask": mask})


def _graph_entry(
    path: Path, precision: Precision, counts: dict[str, int], parity: verify.Parity, **extra
) -> GraphEntry:
    return GraphEntry(
        file=path.name,
        sha256=sha256_file(path),
        bytes=path.stat().st_size,
        precision=precision,
        op_counts=counts,
        parity=parity,
        **extra,
    )


def special_tokens(tok: Tokenizer) -> SpecialTokens:
    ids = {
        name: tok.token_to_id(tok_str)
        for name, tok_str in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"))
    }
    return SpecialTokens(cls=ids["cls"], sep=ids["sep"], pad=ids["pad"] or 0)


def build_bundle(
    loaded: LoadedModel, out: Path, options: ExportOptions = ExportOptions()
) -> Manifest:
    """Write a complete bundle to `out`, or raise and leave `out` as it was."""
    started = time.monotonic()
    cfg = loaded.config
    model = loaded.model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp_name:
        tmp = Path(tmp_name)
        tok = write_tokenizer(loaded, tmp / "tokenizer.json")
        ids, mask = verify.tokenize(tok, verify.PROBE_TEXTS)
        want, want_attn = verify.torch_reference(model, ids, mask)
        graphs: dict[str, GraphEntry] = {}

        raw = tmp / "raw.onnx"
        export_serving(model, raw)
        fused_path = tmp / "encoder.onnx"
        report = optimize.fuse(raw, fused_path, cfg.n_heads, cfg.d_model, cfg.n_layers)
        raw.unlink()
        fp32 = _run(fused_path, ids, mask)[0]
        parity = verify.compare("pytorch", fp32, want)
        verify.require(parity, "encoder.onnx", verify.FP32_MIN_COSINE)
        graphs["encoder"] = _graph_entry(fused_path, "fp32", report.op_counts, parity)

        attn_path = tmp / "attention.onnx"
        export_attention(model, attn_path)
        emb, attn = _run(attn_path, ids, mask)
        parity = verify.compare("pytorch", emb, want)
        attn_diff = float(np.abs(attn - want_attn).max())
        parity = parity.model_copy(update={"attention_max_abs_diff": attn_diff})
        verify.require(parity, "attention.onnx", verify.FP32_MIN_COSINE)
        if not attn_diff <= verify.ATTENTION_MAX_ABS:
            raise verify.ParityError(f"attention.onnx: attention maps differ by {attn_diff:.3g}")
        graphs["attention"] = _graph_entry(
            attn_path, "fp32", optimize.op_counts(onnx.load(str(attn_path))), parity
        )

        if options.fp16:
            path = tmp / "encoder.fp16.onnx"
            counts = optimize.to_fp16(fused_path, path)
            parity = verify.compare("encoder.onnx", _run(path, ids, mask)[0], fp32)
            verify.require(parity, path.name, verify.FP16_MIN_COSINE)
            graphs["encoder_fp16"] = _graph_entry(path, "fp16", counts, parity)
        if options.int8:
            path = tmp / "encoder.int8.onnx"

            def int8_min_cosine(candidate: Path) -> float:
                return verify.compare(
                    "encoder.onnx", _run(candidate, ids, mask)[0], fp32
                ).min_cosine

            report = optimize.to_int8(fused_path, path, int8_min_cosine, options.int8_min_cosine)
            parity = verify.compare("encoder.onnx", _run(path, ids, mask)[0], fp32)
            verify.require(parity, path.name, verify.INT8_MIN_COSINE)
            graphs["encoder_int8"] = _graph_entry(
                path, "int8", report.op_counts, parity, kept_fp32=report.kept_fp32
            )

        manifest = Manifest(
            name=loaded.name,
            source=Source(id=str(loaded.source)),
            num_layers=cfg.n_layers,
            num_heads=cfg.n_heads,
            d_model=cfg.d_model,
            d_ff=cfg.d_ff,
            vocab_size=cfg.vocab_size,
            max_length=loaded.max_length,
            pooling=cfg.pooling,
            normalize=loaded.normalize,
            special_tokens=special_tokens(tok),
            opset=OPSET,
            graphs=graphs,
            tokenizer=FileEntry(
                file="tokenizer.json", sha256=sha256_file(tmp / "tokenizer.json")
            ),
            probe_texts=len(verify.PROBE_TEXTS),
            versions={
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "onnxruntime": ort.__version__,
            },
            created=int(time.time()),
            export_seconds=round(time.monotonic() - started, 2),
        )
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        tmp.mkdir()  # TemporaryDirectory cleans up a path that must exist
    log.info("wrote bundle %s in %.1fs", out, manifest.export_seconds)
    return manifest
