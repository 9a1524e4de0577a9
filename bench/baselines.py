"""The limits headwise is measured against, computed in the same run."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from service.engine.sessions import build_session
from service.tensors import cosines, pad_batch


def session(path: Path, threads: int = 0) -> ort.InferenceSession:
    return build_session(path, threads=threads)


def primary_output(s: ort.InferenceSession) -> list[str]:
    """The pooled output alone, as the service asks for it (no token-vector copy)."""
    return [s.get_outputs()[0].name]


def flops_per_text(n: int, d: int, d_ff: int, layers: int) -> float:
    """Multiply-adds x2 of one encoder pass over n tokens: projections, FFN, QKᵀ and PV."""
    return layers * (8 * n * d * d + 4 * n * d * d_ff + 4 * n * n * d)


def gemm_peak(
    d: int = 384, d_ff: int = 1536, m: int = 4096, threads: int = 0, repeats: int = 20
) -> float:
    """GFLOP/s of ONNX Runtime's own fp32 MatMul on the model's FFN shape (the work it is bound by)."""
    import onnx
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((d, d_ff)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, d_ff])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    s = build_session(model.SerializeToString(), threads=threads)
    x = np.random.default_rng(1).standard_normal((m, d)).astype(np.float32)
    for _ in range(3):
        s.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return 2 * m * d * d_ff / statistics.median(times) / 1e9


def tokenize(tokenizer_path: Path, texts: list[str]) -> list[list[int]]:
    tok = Tokenizer.from_file(str(tokenizer_path))
    return [e.ids for e in tok.encode_batch(texts)]


def padded(batch: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return pad_batch(batch)


def graph_direct(
    graph: Path, sequences: list[list[int]], batch_size: int = 32, rounds: int = 3
) -> tuple[float, np.ndarray]:
    """Texts/s of the graph alone on length-sorted batches (tokenised beforehand, not timed)."""
    s = session(graph)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    inputs = [padded([sequences[i] for i in b]) for b in batches]
    primary = primary_output(s)
    out = np.zeros((len(sequences), s.get_outputs()[0].shape[1] or 0), np.float32)
    s.run(primary, {"input_ids": inputs[0][0], "attention_mask": inputs[0][1]})
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for b, (ids, mask) in zip(batches, inputs, strict=True):
            out[b] = s.run(primary, {"input_ids": ids, "attention_mask": mask})[0]
        best = min(best, time.perf_counter() - t0)
    return len(sequences) / best, out


def single_call_times(
    s: ort.InferenceSession,
    sequence: list[int],
    repeats: int = 200,
    warm: int = 10,
    gap_s: float = 0.0,
) -> list[float]:
    """Seconds of each of `repeats` session calls on one text, back to back, or each after
    `gap_s` idle (as a server's requests arrive: the runtime's threads and caches cool)."""
    ids, mask = padded([sequence])
    feed = {"input_ids": ids, "attention_mask": mask}
    primary = primary_output(s)
    for _ in range(warm):
        s.run(primary, feed)
    times = []
    for _ in range(repeats):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        s.run(primary, feed)
        times.append(time.perf_counter() - t0)
    return times


def single_call_latency(graph: Path, sequence: list[int], repeats: int = 200) -> float:
    """Median seconds of one session call on one short text."""
    return statistics.median(single_call_times(session(graph), sequence, repeats))


def sentence_transformers_rate(
    model_dir: Path, texts: list[str], batch_size: int = 32
) -> float | None:
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.encode(texts[:64], batch_size=batch_size, show_progress_bar=False)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        model.encode(texts, batch_size=batch_size, show_progress_bar=False)
        best = min(best, time.perf_counter() - t0)
    return len(texts) / best


def min_cosine(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    cos = cosines(a, b)
    return float(cos.min()), float(cos.mean())
