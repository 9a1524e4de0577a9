"""Parity of the exported graphs against the PyTorch model, on a fixed probe set of texts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from torch import nn

from service.engine import memory
from service.engine.sessions import build_session
from service.manifest import Parity
from service.tensors import cosines, pad_batch, pad_types

# Fixed probe texts: ordinary sentences, the empty string, CJK, emoji, accents, code, and an
# input longer than any max length (it exercises truncation).
PROBE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "A man is playing a guitar on the street corner.",
    "東京は日本の首都です。北京是中国的首都。",
    "I love this! 😍🔥🚀 #blessed",
    "Café naïve résumé — déjà vu.",
    "def add(a, b):\n    return a + b  # sum",
    "How do I reset my password?",
    "Attention is all you need. " * 80,
    "a",
    "Embeddings map text to vectors so that similar meanings lie close together.",
    "   leading and trailing spaces   ",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
]

# Query-document pairs for cross-encoders: short, non-Latin, and pairs longer than any max
# length (truncated "longest first": the longer side loses tokens until the pair fits).
PROBE_PAIRS = [
    ("how do I reset my password?", "Open settings, choose Security, then Reset password."),
    ("what is the capital of Japan?", "東京は日本の首都です。"),
    ("", "an empty query"),
    ("a", "b"),
    ("Attention is all you need. " * 60, "short document"),
    ("short query", "Transformers relate every token to every other token. " * 60),
    ("Привет, как дела?", "مرحبا بالعالم — नमस्ते दुनिया"),
    ("Café naïve résumé", "I love this! 😍🔥🚀 #blessed"),
]

# Attention maps are compared on the probes cut to their first ATTENTION_PROBE_TOKENS tokens: at
# full length they are L x B x h x N² numbers (6.7 GB for a 28-layer, 16-head model on 500-token
# probes, twice: PyTorch's and the graph's), and whether they are right does not depend on N.
ATTENTION_PROBE_TOKENS = 64
ATTENTION_ROWS = 4
# The probes run in length-sorted groups whose score tensors (rows x heads x N²) stay under this
# many numbers (128 MB in float32): one padded batch of all of them, at a long model's full
# length, held 8 GB in PyTorch and again in ONNX Runtime (bge-m3's 8192); groups of 512 MB
# still held 1.8 GB more than the weights in ONNX Runtime (a 0.6B decoder's probes).
PROBE_SCORES = 2**25
FP32_MIN_COSINE = 0.99999
LOGITS_MAX_ABS = 1e-4  # classifiers: relative to max(1, |logit|)
FP16_MIN_COSINE = 0.999
INT8_TARGET_COSINE = 0.99  # sensitive nodes stay fp32 until the probe set reaches this
INT8_MIN_COSINE = 0.95  # floor against a broken quantiser; the figure itself is recorded
ATTENTION_MAX_ABS = 1e-4


class ParityError(RuntimeError):
    """An exported graph disagrees with the PyTorch model beyond tolerance."""


def tokenize(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return pad_batch([e.ids for e in tokenizer.encode_batch(texts)])


def encode(
    tokenizer: Tokenizer,
    items: list[str] | list[tuple[str, str]],
    inputs: list[str],
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Texts or pairs -> the graph's feeds, right-padded with the model's pad id."""
    encodings = tokenizer.encode_batch(items)
    ids, mask = pad_batch([e.ids for e in encodings], pad_id)
    feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inputs:
        feeds["token_type_ids"] = pad_types([e.type_ids for e in encodings], ids.shape[1])
    return feeds


def attention_probes(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The probes' first ATTENTION_PROBE_TOKENS columns (right-padded: each row's first tokens)."""
    return {name: x[:, :ATTENTION_PROBE_TOKENS] for name, x in feeds.items()}


def probe_groups(feeds: dict[str, np.ndarray], heads: int) -> list[np.ndarray]:
    """Row indices of the probes in length-sorted groups, each under PROBE_SCORES."""
    lengths = feeds["attention_mask"].sum(1)
    groups: list[list[int]] = [[]]
    for i in np.argsort(lengths, kind="stable"):
        n = max(int(lengths[i]), 1)  # the longest so far: sorted ascending
        if groups[-1] and (len(groups[-1]) + 1) * heads * n * n > PROBE_SCORES:
            groups.append([])
        groups[-1].append(int(i))
    return [np.array(g) for g in groups]


def checking_session(path: Path) -> ort.InferenceSession:
    """A session for export's checks: its weights read in place from their data file (no packed
    copies) and no arena keeping the largest probe's activations, so that checking a large
    graph holds about its weights once."""
    return build_session(path, arena=False, prepack=False)


def grouped(
    run: Callable[[dict[str, np.ndarray]], np.ndarray], feeds: dict[str, np.ndarray], heads: int
) -> np.ndarray:
    """run(feeds) over the probes group by group (each cut to its own longest row: the probes
    are right-padded), the rows put back in their order."""
    parts: dict[int, np.ndarray] = {}
    for rows in probe_groups(feeds, heads):
        width = max(int(feeds["attention_mask"][rows].sum(1).max()), 1)
        out = run({name: x[rows, :width] for name, x in feeds.items()})
        parts.update(zip(rows.tolist(), out, strict=True))
        memory.trim()  # a group's freed activations back to the kernel, not kept by glibc
    return np.stack([parts[i] for i in range(len(parts))])


def torch_outputs(
    model: nn.Module, ids: np.ndarray, mask: np.ndarray, token_type_ids: np.ndarray | None = None
) -> np.ndarray:
    """The primary output (embedding or logits) alone: no attention maps kept."""
    types = None if token_type_ids is None else torch.from_numpy(token_type_ids)
    with torch.no_grad():
        out, _ = model(torch.from_numpy(ids), torch.from_numpy(mask), token_type_ids=types)
    return cast(np.ndarray, out.numpy())


def torch_reference(
    model: nn.Module, ids: np.ndarray, mask: np.ndarray, token_type_ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The primary output (embedding or logits) and the stacked attention maps (L, B, h, N, N)."""
    types = None if token_type_ids is None else torch.from_numpy(token_type_ids)
    with torch.no_grad():
        out, attentions = model(
            torch.from_numpy(ids), torch.from_numpy(mask), token_type_ids=types, need_weights=True
        )
    return out.numpy(), torch.stack(attentions).numpy()


def probe_gates(rows: int, n_layers: int, n_heads: int) -> np.ndarray:
    """Head gates (rows, L, h) for the gated check: probe b runs without head b mod L·h (heads
    counted layer by layer), so the probes between them remove heads of every layer."""
    gates = np.ones((rows, n_layers * n_heads), dtype=np.float32)
    gates[np.arange(rows), np.arange(rows) % (n_layers * n_heads)] = 0.0
    return gates.reshape(rows, n_layers, n_heads)


def torch_gated(
    model: nn.Module,
    gates: np.ndarray,
    ids: np.ndarray,
    mask: np.ndarray,
    token_type_ids: np.ndarray | None = None,
) -> np.ndarray:
    """The primary output with each probe's heads gated (models/attention.py)."""
    types = None if token_type_ids is None else torch.from_numpy(token_type_ids)
    with torch.no_grad():
        out, _ = model(
            torch.from_numpy(ids),
            torch.from_numpy(mask),
            token_type_ids=types,
            head_gates=torch.from_numpy(gates),
        )
    return cast(np.ndarray, out.numpy())


def gated_outputs(
    session: ort.InferenceSession, short: dict[str, np.ndarray], gates: np.ndarray
) -> np.ndarray:
    """The attention graph's primary output with `gates` fed as its head_gates."""
    primary = session.get_outputs()[0].name
    out = []
    for start in range(0, len(short["input_ids"]), ATTENTION_ROWS):
        rows = slice(start, start + ATTENTION_ROWS)
        feeds = {name: x[rows] for name, x in short.items()} | {"head_gates": gates[rows]}
        out.append(session.run([primary], feeds)[0])
    return np.concatenate(out)


def attention_diff(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> float:
    """Max |got - want| of attention maps (L, B, h, N, N) over the rows whose query is a real
    token. A padding query's row is defined by nothing: in a local layer all of its window may
    be padding, each key then at the mask value (-10000), where float32 keeps only ~1e-3 of
    the score, so two correct graphs differ there (transformers gives such rows its own values)."""
    real = mask.astype(bool)[None, :, None, :, None]  # (1, B, 1, N_q, 1)
    return float(np.abs(np.where(real, got - want, 0.0)).max())


def attention_check(
    session: ort.InferenceSession, short: dict[str, np.ndarray], want: np.ndarray
) -> tuple[np.ndarray, float]:
    """The attention graph's primary output on the short probes, and its maps' attention_diff
    from PyTorch's `want` (L, B, h, N, N), ATTENTION_ROWS probes per run: a 28-layer model's
    maps of every probe at once held 0.5 GB more than its weights."""
    primary, diffs = [], []
    for start in range(0, len(short["input_ids"]), ATTENTION_ROWS):
        rows = slice(start, start + ATTENTION_ROWS)
        part = {name: x[rows] for name, x in short.items()}
        out, maps = session.run(None, part)
        primary.append(out)
        diffs.append(attention_diff(maps, want[:, rows], part["attention_mask"]))
    return np.concatenate(primary), max(diffs)


def compare(reference: str, got: np.ndarray, want: np.ndarray) -> Parity:
    cos = cosines(got, want)
    return Parity(
        reference=reference,
        texts=len(got),
        max_abs_diff=float(np.abs(got - want).max()),
        min_cosine=float(cos.min()),
        mean_cosine=float(cos.mean()),
    )


def compare_outputs(reference: str, got: np.ndarray, want: np.ndarray, task: str) -> Parity:
    """Embeddings: one cosine per text. Logits: one per label, over the probe pairs (the
    scores' ranking, which is what a reranker or classifier is used for; a single logit's
    cosine would only be its sign)."""
    return compare(reference, got, want) if task == "embed" else compare(reference, got.T, want.T)


def require(parity: Parity, graph: str, min_cosine: float) -> None:
    if not parity.min_cosine >= min_cosine:  # also catches NaN
        raise ParityError(
            f"{graph}: min cosine {parity.min_cosine:.6f} vs {parity.reference} is below "
            f"{min_cosine} (max abs diff {parity.max_abs_diff:.3g}); refusing to write the bundle"
        )


def require_logits(got: np.ndarray, want: np.ndarray, graph: str, max_abs: float) -> None:
    """Logits are compared element-wise: one logit's cosine is only its sign."""
    limit = max_abs * max(1.0, float(np.abs(want).max()))
    diff = float(np.abs(got - want).max())
    if not diff <= limit:  # also catches NaN
        raise ParityError(
            f"{graph}: logits differ by {diff:.3g} (limit {limit:.3g}); refusing to write the bundle"
        )
