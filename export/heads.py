"""Which heads matter over a corpus: Michel, Levy & Neubig (2019), "Are Sixteen Heads Really
Better than One?", on the PyTorch model.

Every head's output is multiplied by a gate ξ_h = 1 (models/attention.py), and its importance is
the expected absolute gradient of the loss with respect to its gate:

    I_h = E_batches |∂L/∂ξ_h|

With query -> positive document pairs the loss is the in-batch contrastive one embedders are
trained with (each query's positive against the batch's other documents: cross-entropy of the
cosine similarities times `scale`, sentence-transformers' MultipleNegativesRankingLoss). With
plain texts there is no task loss to differentiate (a distance to the full model's own embeddings
has zero gradient at ξ = 1), so each head is ablated instead: I_h = E_texts 1 - cos(e, e without
h), a forward pass per head.

As the paper does, scores are then normalised per layer (each layer's vector divided by its L2
norm) and to [0, 1] over the model (min-max); the raw scores are kept beside them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor, nn

from models.encoder import SentenceEncoder, config_of
from models.weights import LoadedModel
from service.pipelines.attention.heatmap import colorize, encode_png
from service.tensors import pad_batch

log = logging.getLogger(__name__)

SCALE = 20.0  # MultipleNegativesRankingLoss's: cosines times 20 (a temperature of 0.05)


@dataclass(frozen=True)
class Corpus:
    """Query -> positive document pairs (`documents` set), or plain texts (`documents` None)."""

    texts: list[str]  # the queries, or the plain texts
    documents: list[str] | None = None

    def __len__(self) -> int:
        return len(self.texts)


PAIR_KEYS = (("query", "positive"), ("anchor", "positive"), ("query", "document"))


def read_corpus(path: Path, limit: int | None = None) -> Corpus:
    """A JSONL file, one example a line: a pair as {"query", "positive"} ({"anchor",
    "positive"}, {"query", "document"}) or [query, document]; a plain text as {"text"} or a
    string. Every line of one kind; blank lines skipped."""
    texts: list[str] = []
    documents: list[str] = []
    kinds: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            pair = _pair(item)
            if pair is not None:
                kinds.add("pairs")
                texts.append(pair[0])
                documents.append(pair[1])
            elif isinstance(item, str) or (
                isinstance(item, dict) and isinstance(item.get("text"), str)
            ):
                kinds.add("texts")
                texts.append(item if isinstance(item, str) else item["text"])
            else:
                raise ValueError(
                    f'{path}:{number}: expected a pair ({{"query", "positive"}} or [query, '
                    'document]) or a text ({"text"} or a string)'
                )
            if len(kinds) > 1:
                raise ValueError(f"{path}:{number}: the file mixes pairs and plain texts")
            if limit is not None and len(texts) >= limit:
                break
    if not texts:
        raise ValueError(f"{path}: no examples")
    return Corpus(texts, documents if kinds == {"pairs"} else None)


def _pair(item: object) -> tuple[str, str] | None:
    if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return item[0], item[1]
    if isinstance(item, dict):
        for a, b in PAIR_KEYS:
            if isinstance(item.get(a), str) and isinstance(item.get(b), str):
                return item[a], item[b]
    return None


class Encoder:
    """Texts -> the model's embeddings (B, d), through its tokenizer, with head gates."""

    def __init__(self, loaded: LoadedModel) -> None:
        if not isinstance(loaded.model, SentenceEncoder):
            raise ValueError(
                f"{loaded.name} is a {loaded.task} model: corpus head importance is for "
                "embedding models (their in-batch contrastive loss, or ablation)"
            )
        self.model = loaded.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)  # only the gates are differentiated
        self.tokenizer = Tokenizer.from_file(str(loaded.tokenizer_path))
        self.tokenizer.no_padding()
        self.max_length = loaded.max_length
        self.tokenizer.enable_truncation(loaded.max_length)
        cfg = config_of(self.model)
        self.layers, self.heads = cfg.n_layers, cfg.n_heads
        self.pad = cfg.pad_token_id

    def __call__(self, texts: list[str], gates: Tensor) -> Tensor:
        """gates: (L, h) for every text, or (B, L, h) -> normalised embeddings (B, d)."""
        return F.normalize(self.pooled(texts, gates), dim=-1)  # (B, d)

    def pooled(self, texts: list[str], gates: Tensor | None = None) -> Tensor:
        """The pooled output, not normalised (what the serving graph returns) -> (B, d)."""
        ids, mask = pad_batch([e.ids for e in self.tokenizer.encode_batch(texts)], self.pad)
        if gates is not None and gates.dim() == 2:
            gates = gates.expand(len(texts), -1, -1)  # (B, L, h)
        pooled: Tensor = self.model(
            torch.from_numpy(ids), torch.from_numpy(mask), head_gates=gates
        )[0]
        return pooled


def _batches(count: int, size: int) -> Iterator[slice]:
    for start in range(0, count, size):
        yield slice(start, start + size)


def contrastive_loss(queries: Tensor, documents: Tensor, scale: float = SCALE) -> Tensor:
    """Each query's positive (same row) against every document of the batch."""
    scores = scale * queries @ documents.T  # (B, B)
    return F.cross_entropy(scores, torch.arange(len(queries)))


def gradients(
    encode: Encoder, corpus: Corpus, batch_size: int = 32, linears: Sequence[nn.Linear] = ()
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Means over batches of the contrastive loss's absolute derivatives: per head, |∂L/∂ξ_h|
    (L, h); per input column j of each of `linears`, |Σ_i W[i, j] ∂L/∂W[i, j]|, the derivative
    for a gate on that column (TextPruner's score of an FFN neuron, W = W_2)."""
    assert corpus.documents is not None
    heads = torch.zeros(encode.layers, encode.heads, dtype=torch.float64)
    columns = [torch.zeros(w.in_features, dtype=torch.float64) for w in linears]
    for w in linears:
        w.weight.requires_grad_(True)
    batches = 0
    try:
        for rows in _batches(len(corpus), batch_size):
            queries, documents = corpus.texts[rows], corpus.documents[rows]
            if len(queries) < 2:  # one pair has no other document to be told from
                continue
            gates = torch.ones(encode.layers, encode.heads, requires_grad=True)
            loss = contrastive_loss(encode(queries, gates), encode(documents, gates))
            grads = torch.autograd.grad(loss, [gates, *(w.weight for w in linears)])
            heads += grads[0].abs().double()
            for total, w, g in zip(columns, linears, grads[1:], strict=True):
                total += (w.weight.detach() * g).sum(0).abs().double()
            batches += 1
    finally:
        for w in linears:
            w.weight.requires_grad_(False)
    if not batches:
        raise ValueError("head importance needs at least two pairs")
    return (heads / batches).numpy(), [(c / batches).numpy() for c in columns]


def gradient_importance(encode: Encoder, corpus: Corpus, batch_size: int = 32) -> np.ndarray:
    """I_h = mean over batches of |∂L/∂ξ_h| (L, h), the contrastive loss on the pairs."""
    return gradients(encode, corpus, batch_size)[0]


def ablation_importance(encode: Encoder, corpus: Corpus, batch_size: int = 32) -> np.ndarray:
    """I_h = mean over texts of 1 - cos(e, e without head h) (L, h)."""
    total = np.zeros((encode.layers, encode.heads))
    with torch.no_grad():
        for rows in _batches(len(corpus), batch_size):
            texts = corpus.texts[rows]
            whole = encode(texts, torch.ones(encode.layers, encode.heads))
            for layer in range(encode.layers):
                for head in range(encode.heads):
                    gates = torch.ones(encode.layers, encode.heads)
                    gates[layer, head] = 0.0
                    lost = 1 - (encode(texts, gates) * whole).sum(-1)  # (B,)
                    total[layer, head] += float(lost.double().sum())
    return total / len(corpus)


def normalise(raw: np.ndarray) -> np.ndarray:
    """The paper's: each layer divided by its L2 norm, then min-max over the model to [0, 1]."""
    per_layer = raw / (np.linalg.norm(raw, axis=1, keepdims=True) + 1e-20)
    low, high = per_layer.min(), per_layer.max()
    return (per_layer - low) / (high - low) if high > low else np.zeros_like(per_layer)


@dataclass
class HeadScores:
    model: str
    method: str  # "gradient" (pairs) or "ablation" (texts)
    examples: int
    layers: int
    heads: int
    importance: list[list[float]]  # normalised, (L, h)
    raw: list[list[float]]  # before normalisation

    def ranked(self) -> list[tuple[int, int]]:
        """(layer, head) from the least important up."""
        flat = np.asarray(self.importance).ravel()
        order = np.argsort(flat, kind="stable")
        return [(int(i) // self.heads, int(i) % self.heads) for i in order]


def head_importance(loaded: LoadedModel, corpus: Corpus, batch_size: int = 32) -> HeadScores:
    encode = Encoder(loaded)
    pairs = corpus.documents is not None
    log.info(
        "%s: head importance over %d %s (%s)",
        loaded.name,
        len(corpus),
        "pairs" if pairs else "texts",
        "gradient of the in-batch contrastive loss" if pairs else "ablation, a pass per head",
    )
    if pairs:
        raw = gradient_importance(encode, corpus, batch_size)
    else:
        raw = ablation_importance(encode, corpus, batch_size)
    return HeadScores(
        model=loaded.name,
        method="gradient" if pairs else "ablation",
        examples=len(corpus),
        layers=encode.layers,
        heads=encode.heads,
        importance=normalise(raw).tolist(),
        raw=raw.tolist(),
    )


def grid_png(importance: np.ndarray, cell: int = 24, gap: int = 2) -> bytes:
    """(L, h) scores in [0, 1] as a PNG: a row of cells per layer, a column per head."""
    layers, heads = importance.shape
    img = np.full((layers * (cell + gap) + gap, heads * (cell + gap) + gap, 3), 255, np.uint8)
    colours = colorize(importance)  # (L, h, 3)
    for layer in range(layers):
        for head in range(heads):
            y, x = gap + layer * (cell + gap), gap + head * (cell + gap)
            img[y : y + cell, x : x + cell] = colours[layer, head]
    return encode_png(img)


def write(scores: HeadScores, out: Path) -> tuple[Path, Path]:
    """heads.json and heads.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    data, image = out / "heads.json", out / "heads.png"
    data.write_text(json.dumps(asdict(scores), indent=1) + "\n", encoding="utf-8")
    image.write_bytes(grid_png(np.asarray(scores.importance)))
    return data, image
