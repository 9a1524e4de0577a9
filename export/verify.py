"""Parity of the exported graphs against the PyTorch model, on a fixed probe set of texts."""

from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer

from models.encoder import SentenceEncoder
from service.manifest import Parity
from service.tensors import cosines, pad_batch

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
]

FP32_MIN_COSINE = 0.99999
FP16_MIN_COSINE = 0.999
INT8_TARGET_COSINE = 0.99  # sensitive nodes stay fp32 until the probe set reaches this
INT8_MIN_COSINE = 0.95  # floor against a broken quantiser; the figure itself is recorded
ATTENTION_MAX_ABS = 1e-4


class ParityError(RuntimeError):
    """An exported graph disagrees with the PyTorch model beyond tolerance."""


def tokenize(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return pad_batch([e.ids for e in tokenizer.encode_batch(texts)])


def torch_reference(
    model: SentenceEncoder, ids: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        pooled, attentions = model(torch.from_numpy(ids), torch.from_numpy(mask), need_weights=True)
    return pooled.numpy(), torch.stack(attentions).numpy()


def compare(reference: str, got: np.ndarray, want: np.ndarray) -> Parity:
    cos = cosines(got, want)
    return Parity(
        reference=reference,
        texts=len(got),
        max_abs_diff=float(np.abs(got - want).max()),
        min_cosine=float(cos.min()),
        mean_cosine=float(cos.mean()),
    )


def require(parity: Parity, graph: str, min_cosine: float) -> None:
    if not parity.min_cosine >= min_cosine:  # also catches NaN
        raise ParityError(
            f"{graph}: min cosine {parity.min_cosine:.6f} vs {parity.reference} is below "
            f"{min_cosine} (max abs diff {parity.max_abs_diff:.3g}); refusing to write the bundle"
        )
