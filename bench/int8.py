"""int8 against fp32 in the same run: graph speed (rounds interleaved, so that the load other
programs put on a shared machine falls on both alike), and what users feel of it: retrieval
and similarity ranking on the held-out query -> document pairs the export's gate never saw."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bench.baselines import padded, primary_output, session
from service.engine import quality
from service.manifest import Manifest

log = logging.getLogger("bench")


def interleaved_rates(
    graphs: list[Path], sequences: list[list[int]], batch_size: int = 32, rounds: int = 5
) -> tuple[list[float], list[np.ndarray]]:
    """Best texts/s of each graph on length-sorted batches, one round of each in turn."""
    return sessions_rates([session(g) for g in graphs], sequences, batch_size, rounds)


def sessions_rates(
    sessions: list[Any], sequences: list[list[int]], batch_size: int = 32, rounds: int = 5
) -> tuple[list[float], list[np.ndarray]]:
    """As interleaved_rates, for sessions already built (ONNX Runtime's or OpenVINO's)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    feeds = [
        {"input_ids": ids, "attention_mask": mask}
        for ids, mask in (padded([sequences[i] for i in b]) for b in batches)
    ]
    outs = []
    for s in sessions:
        width = s.run(primary_output(s), feeds[0])[0].shape[1]  # a graph may not state it
        outs.append(np.zeros((len(sequences), width), np.float32))
    best = [float("inf")] * len(sessions)
    for _ in range(rounds):
        for k, s in enumerate(sessions):
            t0 = time.perf_counter()
            for b, feed in zip(batches, feeds, strict=True):
                outs[k][b] = s.run(primary_output(s), feed)[0]  # as the service asks
            best[k] = min(best[k], time.perf_counter() - t0)
    return [len(sequences) / t for t in best], outs


def holdout_quality(bundle: Path, manifest: Manifest, pairs: int | None = None) -> dict:
    """Retrieval and Spearman of int8 against fp32 on the held-out pairs."""
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    held = quality.docstring_pairs("holdout", limit=pairs)
    gate = manifest.graphs["encoder_int8"].quality
    max_drop = gate.max_drop_allowed if gate and gate.max_drop_allowed is not None else None
    min_spearman = gate.min_spearman_allowed if gate else None
    g = quality.RetrievalGate(
        bundle / "encoder.onnx",
        tok,
        held,
        quality.MAX_DROP_POINTS if max_drop is None else max_drop,
        quality.MIN_SPEARMAN if min_spearman is None else min_spearman,
    )
    q = g.measure(bundle / manifest.graphs["encoder_int8"].file)
    return {
        **q.model_dump(),
        "split": "holdout",
        "fingerprint": held.fingerprint,
        "max_drop": q.max_drop,
        "within": quality.within(q, q.max_drop_allowed, q.min_spearman_allowed),
    }
