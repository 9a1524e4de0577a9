"""Build a bundle folder: export, fuse, gate on fusion and parity, then write the manifest.

Any size: each graph is one ONNX file, or the graph and one external data file beside it when
its weights pass what one protobuf holds (export/external.py); the manifest lists every file
with its sha256.

Memory, for checkpoints of any size: the model may hold its weights as stored (half precision:
models/precision.py computes its reference outputs in float32 from them); both graphs are
traced without the weights, which are written into them a tensor at a time (export/stream.py);
then (with `release_weights`) the PyTorch weights are let go, and every check runs a session
that reads the graph's weights where they lie in its data file (verify.checking_session). A
0.6B decoder's bfloat16 checkpoint (1.19 GB) exports at 2.2x its size, where tracing the
float32 model took 4x.
"""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np
import onnx
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from export import external, fused, openvino_int8, optimize, outputs, templates, verify
from export.entries import graph_entry
from export.onnx import OPSET, export_attention, export_serving, graph_inputs
from models.outputs import MultiOutputEncoder
from models.precision import float32_compute
from models.weights import LoadedModel
from service.bundle import MANIFEST, sha256_file
from service.engine import memory, openvino_session, quality
from service.engine.runtime import pad_to_length
from service.manifest import (
    FileEntry,
    GraphEntry,
    Manifest,
    Parity,
    Pruning,
    RerankTemplate,
    Source,
    SpecialTokens,
)
from service.pipelines.template import PairTemplate, added_around, with_tokenizer
from service.tensors import pad_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOptions:
    fp16: bool = False
    int8: bool = False
    # The int8 gate (embedding models): at most `int8_max_drop` points of recall@10 and of MRR
    # lost against fp32 on `int8_pairs` query -> document pairs of real text, and pair
    # similarities ranked alike (Spearman >= `int8_min_spearman`). 0 pairs: no retrieval gate.
    int8_pairs: int = 1000
    int8_max_drop: float = quality.MAX_DROP_POINTS
    int8_min_spearman: float = quality.MIN_SPEARMAN
    # Also require this min cosine to fp32 on the probe texts (0: reported, not required).
    # Rerankers and classifiers, which retrieval does not measure, are held to INT8_TARGET_COSINE.
    int8_min_cosine: float = 0.0
    # Ship a graph whose attention did not fuse (marked fused=false) instead of failing.
    allow_unfused: bool = False
    # A causal LM reranker's template (None: Qwen3-Reranker's card), and the format of an
    # embedder's instructions (None: derived from its query prompt, if it has the form).
    rerank_template: templates.TemplateSpec | None = None
    instruction_format: str | None = None
    # Move the PyTorch weights to the meta device once both graphs are traced (the CLI does:
    # a large model is then never held twice); the LoadedModel is spent afterwards.
    release_weights: bool = False
    # A pruned model (export/prune.py): what was removed, for the manifest.
    pruning: Pruning | None = None
    # "max_length": every text padded to the max length and every position attended (SigLIP's
    # text tower, as its model card runs it): the probes are, and the manifest says so.
    text_padding: Literal["longest", "max_length"] = "longest"


def write_tokenizer(loaded: LoadedModel, out: Path) -> Tokenizer:
    """The model's tokenizer, truncating at the model's max length, "longest first" for pairs,
    with no fixed padding.

    Shipped tokenizer.json files often bake in other values (all-MiniLM-L6-v2: truncation and
    fixed padding at 128, while the model was trained to 256); the bundle states the right one.
    Special tokens and the pair template stay the family's own (its post-processor).
    """
    tok = Tokenizer.from_file(str(loaded.tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(max_length=loaded.max_length, strategy="longest_first")
    tok.save(str(out))
    return tok


def _primary(session: ort.InferenceSession, feeds: dict[str, np.ndarray], heads: int) -> np.ndarray:
    primary = [session.get_outputs()[0].name]
    return verify.grouped(lambda f: session.run(primary, f)[0], feeds, heads)


def _serve(path: Path, feeds: dict[str, np.ndarray], heads: int) -> np.ndarray:
    """The graph's primary output on the probes, in groups bounded in memory (verify.grouped)."""
    out = _primary(verify.checking_session(path), feeds, heads)
    memory.trim()  # the session is gone: glibc keeps freed blocks under 32 MB resident otherwise
    return out


class _Fusion(TypedDict):
    fused: bool
    unfused_reason: str | None


class _OutputParity(TypedDict, total=False):
    output_parity: dict[str, Parity]  # a model with outputs besides the primary one


def special_tokens(tok: Tokenizer, pad_id: int) -> SpecialTokens:
    """The ids the family's post-processor adds before a text (cls: [CLS], <s>) and after it
    (sep: [SEP], </s>, a decoder's end token)."""
    before, after = added_around(with_tokenizer(tok))
    return SpecialTokens(
        cls=before[0] if before else None, sep=after[-1] if after else None, pad=pad_id
    )


def rerank_template(loaded: LoadedModel, options: ExportOptions) -> RerankTemplate | None:
    """A causal LM reranker's template with its answer tokens' ids; None for other models."""
    if loaded.judge_ids is None:
        if options.rerank_template is not None:
            raise ValueError(
                "a rerank template applies to a *ForCausalLM exported with --task rerank"
            )
        return None
    spec = options.rerank_template or templates.QWEN3_RERANKER
    if loaded.judge_tokens != (spec.yes, spec.no):
        raise ValueError(f"the model was loaded judging {loaded.judge_tokens}, not the template's")
    return spec.with_ids(*loaded.judge_ids)


def probe_feeds(
    tok: Tokenizer,
    loaded: LoadedModel,
    template: RerankTemplate | None,
    inputs: list[str],
    padding: str = "longest",
) -> dict[str, np.ndarray]:
    """The parity probes as the service will feed them: texts (padded to the max length, every
    position attended, where the model card does: service.engine.runtime.pad_to_length),
    pairs, or pairs through the reranker's template (service/pipelines/template.py)."""
    pad = loaded.config.pad_token_id
    if loaded.task == "embed" and padding == "max_length":
        padded = Tokenizer.from_str(tok.to_str())
        pad_to_length(padded, loaded.max_length, pad)
        return verify.encode(padded, verify.PROBE_TEXTS, inputs, pad)
    if loaded.task == "embed":
        return verify.encode(tok, verify.PROBE_TEXTS, inputs, pad)
    if template is None:
        return verify.encode(tok, verify.PROBE_PAIRS, inputs, pad)
    pairs = PairTemplate(template, with_tokenizer(tok), loaded.max_length)
    sequences = pairs.sequences(verify.PROBE_PAIRS)
    ids, mask = pad_batch([s.ids for s in sequences], pad)
    return {"input_ids": ids, "attention_mask": mask}


def release(loaded: LoadedModel) -> None:
    """Hand the PyTorch weights back: the module stays, its tensors become meta tensors."""
    loaded.model.to("meta")
    gc.collect()
    memory.trim()  # glibc keeps freed blocks under 32 MB resident otherwise


def _check(got: np.ndarray, want: np.ndarray, graph: str, task: str, min_cosine: float) -> Parity:
    """Parity of a graph's primary output with PyTorch's; raises when off."""
    parity = verify.compare_outputs("pytorch", got, want, task)
    if task == "embed":
        verify.require(parity, graph, min_cosine)
    else:
        verify.require_logits(got, want, graph, verify.LOGITS_MAX_ABS)
    return parity


def _gate(
    fused: Path, tok: Tokenizer, task: str, options: ExportOptions
) -> quality.RetrievalGate | None:
    """The int8 retrieval gate of an embedding model (fp32 embedded once, for both runtimes'
    int8 graphs); None for a scorer, or with --int8-pairs 0."""
    if task != "embed" or options.int8_pairs <= 0:
        return None
    pairs = quality.docstring_pairs("gate", limit=options.int8_pairs)
    return quality.RetrievalGate(
        fused, tok, pairs, options.int8_max_drop, options.int8_min_spearman
    )


def _int8(
    fused: Path,
    path: Path,
    feeds: dict[str, np.ndarray],
    fp32: np.ndarray,
    task: str,
    options: ExportOptions,
    heads: int,
    gate: quality.RetrievalGate | None,
) -> GraphEntry:
    """The fastest int8 graph that passes the gate, with what the gate measured."""

    def probe_parity(candidate: Path) -> Parity:
        got = _serve(candidate, feeds, heads)
        return verify.compare_outputs("encoder.onnx", got, fp32, task)

    def damage(candidate: Path) -> float:
        return 1.0 - probe_parity(candidate).min_cosine

    min_cosine = options.int8_min_cosine if task == "embed" else verify.INT8_TARGET_COSINE
    # The floor against a broken quantiser is part of the search: a graph under it keeps nodes.
    min_cosine = max(min_cosine, verify.INT8_MIN_COSINE)

    def passes(candidate: Path) -> bool:
        if probe_parity(candidate).min_cosine < min_cosine:
            return False
        return gate is None or gate.passes(candidate)

    q = optimize.to_int8(fused, path, passes, damage)
    parity = probe_parity(path)
    verify.require(parity, path.name, verify.INT8_MIN_COSINE)
    return graph_entry(
        path,
        "int8",
        q.op_counts,
        parity,
        kept_fp32=q.kept_fp32,
        quantised=q.quantised,
        quality=gate.measure(path) if gate is not None else None,
    )


def _output_dim(loaded: LoadedModel) -> int | None:
    """The logits' count, or the last Dense module's out_features (EmbeddingGemma); None when
    the embedding is d_model wide as it leaves the encoder."""
    if loaded.task != "embed":
        return len(loaded.labels)
    return loaded.config.embedding_dim if loaded.config.dense_layers else None


def build_bundle(
    loaded: LoadedModel,
    out: Path,
    options: ExportOptions = ExportOptions(),
    source: Source | None = None,
    towers: Callable[[Path], dict[str, Any]] | None = None,
) -> Manifest:
    """Write a complete bundle to `out`, or raise and leave `out` as it was.

    towers: writes more graphs into the bundle's folder (an image-text model's vision tower:
    export/image_text.py) and returns the manifest fields that describe them."""
    started = time.monotonic()
    cfg = loaded.config
    model = loaded.model.eval()
    inputs = graph_inputs(model)
    task = loaded.task
    template = rerank_template(loaded, options)
    instructions = templates.instruction_format(loaded.prompts, options.instruction_format)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp_name:
        tmp = Path(tmp_name)
        tok = write_tokenizer(loaded, tmp / "tokenizer.json")
        feeds = probe_feeds(tok, loaded, template, inputs, options.text_padding)
        probes = len(feeds["input_ids"])
        heads = cfg.n_heads
        multi = model if isinstance(model, MultiOutputEncoder) else None
        if multi is not None and options.int8:
            raise ValueError(
                "--int8 is gated on dense retrieval; a model with sparse or multi-vector "
                "outputs is not quantised yet"
            )
        short = verify.attention_probes(feeds)
        with float32_compute(model):  # half-precision weights: computed in float32
            want = verify.grouped(lambda f: verify.torch_outputs(model, *f.values()), feeds, heads)
            want_short, want_attn = verify.torch_reference(model, *short.values())
            gates = verify.probe_gates(len(short["input_ids"]), cfg.n_layers, cfg.n_heads)
            want_gated = verify.torch_gated(model, gates, *short.values())
            want_outputs = outputs.torch_outputs(multi, feeds) if multi is not None else {}
        graphs: dict[str, GraphEntry] = {}

        # Each raw graph in a folder of its own, with its data file (export/stream.py).
        raw, attn_raw = tmp / "raw" / "encoder.onnx", tmp / "raw-attention" / "attention.onnx"
        raw.parent.mkdir()
        attn_raw.parent.mkdir()
        plan = fused.plan(cfg)
        export_serving(model, raw, emit_fused=plan.kind == "emit")
        export_attention(model, attn_raw)
        if options.release_weights:
            del model
            release(loaded)

        fused_path = tmp / "encoder.onnx"
        report = optimize.fuse(raw, fused_path, cfg, plan, options.allow_unfused)
        shutil.rmtree(raw.parent)
        fusion: _Fusion = {"fused": report.fused, "unfused_reason": report.unfused_reason}
        fp32 = _serve(fused_path, feeds, heads)
        parity = _check(fp32, want, "encoder.onnx", task, verify.FP32_MIN_COSINE)
        extra: _OutputParity = {}
        if multi is not None:
            extra["output_parity"] = outputs.check(multi, fused_path, feeds, want_outputs)
        graphs["encoder"] = graph_entry(
            fused_path, "fp32", report.op_counts, parity, **fusion, **extra
        )

        attn_path = tmp / "attention.onnx"
        external.rewrite(attn_raw, attn_path)
        shutil.rmtree(attn_raw.parent)
        checking = verify.checking_session(attn_path)
        emb, attn_diff = verify.attention_check(checking, short, want_attn)
        del want_attn
        parity = _check(emb, want_short, "attention.onnx", task, verify.FP32_MIN_COSINE)
        parity = parity.model_copy(update={"attention_max_abs_diff": attn_diff})
        if not attn_diff <= verify.ATTENTION_MAX_ABS:
            raise verify.ParityError(f"attention.onnx: attention maps differ by {attn_diff:.3g}")
        got_gated = verify.gated_outputs(checking, short, gates)
        gated = _check(got_gated, want_gated, "attention.onnx gated", task, verify.FP32_MIN_COSINE)
        del checking
        counts = optimize.op_counts(onnx.load(str(attn_path), load_external_data=False))
        graphs["attention"] = graph_entry(attn_path, "fp32", counts, parity, gated_parity=gated)

        if options.fp16:
            path = tmp / "encoder.fp16.onnx"
            counts = optimize.to_fp16(fused_path, path)
            got = _serve(path, feeds, heads)
            parity = verify.compare_outputs("encoder.onnx", got, fp32, task)
            verify.require(parity, path.name, verify.FP16_MIN_COSINE)
            extra = {}
            if multi is not None:
                extra["output_parity"] = outputs.check(
                    multi, path, feeds, want_outputs, "pytorch", verify.FP16_MIN_COSINE
                )
            graphs["encoder_fp16"] = graph_entry(path, "fp16", counts, parity, **fusion, **extra)
        if options.int8:
            path = tmp / "encoder.int8.onnx"
            gate = _gate(fused_path, tok, task, options)
            entry = _int8(fused_path, path, feeds, fp32, task, options, heads, gate)
            graphs["encoder_int8"] = entry.model_copy(update=fusion)
            # OpenVINO's own int8 (it cannot read ONNX Runtime's), through the same gate.
            why = openvino_int8.available()
            if gate is None or why is not None:
                log.info(
                    "no OpenVINO int8 graph: %s", why or "its gate is retrieval (embedding models)"
                )
            else:
                probe = openvino_session.probe_of(
                    special_tokens(tok, cfg.pad_token_id), cfg.vocab_size, loaded.max_length
                )
                ov = openvino_int8.quantize(
                    fused_path, tmp, tok, cfg.pad_token_id, feeds, fp32, gate, probe
                )
                if ov is not None:
                    graphs["encoder_int8_openvino"] = ov

        more = towers(tmp) if towers is not None else {}
        specials = special_tokens(tok, cfg.pad_token_id)
        manifest = Manifest(
            name=loaded.name,
            source=source or Source(kind="folder", id=str(loaded.source)),
            task=task,
            architecture=cfg.architecture,
            num_layers=cfg.n_layers,
            num_heads=cfg.n_heads,
            d_model=cfg.d_model,
            head_dim=cfg.d_k,
            d_ff=cfg.d_ff,
            vocab_size=cfg.vocab_size,
            max_length=loaded.max_length,
            pooling=cfg.pooling,
            normalize=loaded.normalize,
            output_dim=_output_dim(loaded),
            prompts=loaded.prompts,
            default_prompt_name=loaded.default_prompt_name,
            instruction_format=instructions,
            rerank_template=template,
            labels=loaded.labels,
            problem_type=loaded.problem_type,
            special_tokens=specials,
            opset=OPSET,
            inputs=inputs,
            graphs=graphs,
            tokenizer=FileEntry(file="tokenizer.json", sha256=sha256_file(tmp / "tokenizer.json")),
            probe_texts=probes,
            versions={
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "onnxruntime": ort.__version__,
            },
            created=int(time.time()),
            export_seconds=round(time.monotonic() - started, 2),
            pruning=options.pruning,
            text_padding=options.text_padding,
            **outputs.manifest_fields(loaded, tok, specials.cls, specials.sep),
            **more,
        )
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        tmp.mkdir()  # TemporaryDirectory cleans up a path that must exist
    log.info("wrote bundle %s in %.1fs", out, manifest.export_seconds)
    return manifest
