"""A fake backend: no graph, no torch, deterministic outputs, and a gate a test can hold.

`entered` is set when a batch reaches the backend; the batch waits there until `release` is
set (it is, unless a test clears it). Tests wait on these events, never on time.
"""

from __future__ import annotations

import threading

import numpy as np
from tokenizers import Encoding, Tokenizer, models, pre_tokenizers, processors

from service.engine.runtime import RuntimeInfo
from service.manifest import FileEntry, GraphEntry, Manifest, Parity, Source, SpecialTokens
from service.registry import ModelSpec
from service.settings import Settings
from service.tensors import Batch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = ["the", "a", "an", "of", "to", "and", "is", "in", "it", "cat", "dog", "fox", "zebra", "hello", "world", "one", "two", "three"]


def word_tokenizer(max_length: int) -> Tokenizer:
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.enable_truncation(max_length)
    return tok


def fake_manifest(name: str, d: int = 8, layers: int = 2, heads: int = 2, **fields) -> Manifest:
    parity = Parity(reference="none", texts=0, max_abs_diff=0, min_cosine=1, mean_cosine=1)
    graph = GraphEntry(
        file="fake.onnx", sha256="0" * 64, bytes=0, precision="fp32", op_counts={}, parity=parity
    )
    values = dict(
        name=name,
        source=Source(kind="random", id="fake"),
        num_layers=layers,
        num_heads=heads,
        d_model=384,  # a real model's width: attention's n² cost is weighed against it
        d_ff=1536,
        output_dim=d,  # the vectors (or logits) the fake returns
        vocab_size=len(SPECIALS) + len(WORDS),
        max_length=16,
        normalize=True,
        special_tokens=SpecialTokens(cls=2, sep=3, pad=0),
        opset=17,
        graphs={"encoder": graph, "attention": graph},
        tokenizer=FileEntry(file="tokenizer.json", sha256="0" * 64),
        probe_texts=0,
    )
    values.update(fields)
    return Manifest(**values)


class FakeBackend:
    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.info = RuntimeInfo(["CPUExecutionProvider"], "encoder", "fp32")
        self.tokenizer = word_tokenizer(manifest.max_length)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.seen: list[list[int]] = []  # every real sequence computed
        self.fail_next = False
        self.token_output = True
        self.inline = False  # a test may hold a batch in the backend: never on the loop
        self.measurable = False  # its runs are gated by the test: warm-up does not time them
        self.streams = 1
        self.lone = False
        self.long_tokens = 0  # a test sets it to have a long lane
        self.long_seen: list[list[int]] = []
        self.long_entered = threading.Event()
        self.long_release = threading.Event()
        self.long_release.set()

    def tokenize(
        self, texts: list[str], add_special_tokens: bool = True, direction: str = "right"
    ) -> list[Encoding]:
        self.tokenizer.enable_truncation(self.manifest.max_length, direction=direction)
        return self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

    def tokenize_pairs(self, pairs: list[tuple[str, str]]) -> list[Encoding]:
        return self.tokenizer.encode_batch(pairs)

    def pair_ids(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int], bool]]:
        return [(e.ids, e.type_ids, bool(e.overflowing)) for e in self.tokenize_pairs(pairs)]

    def tokenize_whole(self, texts: list[str]) -> list[Encoding]:
        self.tokenizer.no_truncation()
        return self.tokenizer.encode_batch(texts)

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _hold(self, batch: Batch) -> None:
        self.entered.set()
        assert self.release.wait(20), "the test never released the fake backend"
        mask = batch.attention_mask.astype(bool)
        self.seen.extend(row[m].tolist() for row, m in zip(batch.input_ids, mask, strict=True))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("/secret/path exploded")

    def vectors(self, batch: Batch) -> np.ndarray:
        """Row i: a deterministic function of its real token ids -> (B, dimensions)."""
        d = self.manifest.dimensions
        freq = np.arange(1, d + 1, dtype=np.float64)
        out = np.zeros((len(batch), d), dtype=np.float32)
        for i, (ids, m) in enumerate(zip(batch.input_ids, batch.attention_mask, strict=True)):
            real = ids[m.astype(bool)].astype(np.float64)
            out[i] = np.cos(np.outer(real + 1, freq)).sum(0) + 0.1 * len(real)
        return out

    def run(self, batch: Batch) -> np.ndarray:
        self._hold(batch)
        return self.vectors(batch)

    def run_long(self, batch: Batch) -> np.ndarray:
        self.long_entered.set()
        assert self.long_release.wait(20), "the test never released the long lane"
        mask = batch.attention_mask.astype(bool)
        self.long_seen.extend(row[m].tolist() for row, m in zip(batch.input_ids, mask, strict=True))
        return self.run(batch)

    def run_tokens(self, batch: Batch) -> np.ndarray:
        """Token i's vector: a function of its id and position -> (B, N, dimensions)."""
        self._hold(batch)
        d = self.manifest.dimensions
        pos = np.arange(batch.input_ids.shape[1])[None, :, None]
        return np.cos(batch.input_ids[:, :, None] * 0.1 + pos + np.arange(d)).astype(np.float32)

    def run_outputs(self, batch: Batch, long: bool = False) -> dict[str, np.ndarray]:
        """Each output the manifest lists, a deterministic function of ids and positions: the
        dense vector as `vectors`; a token's weight (id % 5) / 4 (0 for some ids); a vocabulary
        vector counting each real id; a token's vector a unit one of its id and position."""
        self._hold(batch)
        m = self.manifest
        ids = batch.input_ids
        out: dict[str, np.ndarray] = {}
        if "dense" in m.outputs:
            out["sentence_embedding"] = self.vectors(batch)
        if m.sparse is not None and m.sparse.kind == "token_weights":
            out[m.sparse.graph_output] = ((ids % 5) / 4).astype(np.float32)
        if m.sparse is not None and m.sparse.kind == "vocabulary":
            counts = np.zeros((len(batch), m.vocab_size), dtype=np.float32)
            for i, (row, keep) in enumerate(zip(ids, batch.attention_mask, strict=True)):
                np.add.at(counts[i], row[keep.astype(bool)], 1.0)
            out[m.sparse.graph_output] = counts
        if m.multi_vector is not None:
            pos = np.arange(ids.shape[1])[None, :, None]
            v = np.cos(ids[:, :, None] * 0.3 + pos * 0.7 + np.arange(m.multi_vector.dim))
            out[m.multi_vector.graph_output] = (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)
        return out

    def attend(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Uniform attention over each text's real tokens: rows sum to 1, padding gets 0."""
        self._hold(batch)
        m = self.manifest
        keep = batch.attention_mask.astype(np.float32)  # (B, N)
        rows = keep / keep.sum(1, keepdims=True)
        n = keep.shape[1]
        maps = np.broadcast_to(rows[None, :, None, None, :], (m.num_layers, len(batch), m.num_heads, n, n))
        return self.vectors(batch), np.ascontiguousarray(maps)

    def gated(self, batch: Batch) -> np.ndarray:
        """The vectors, each row scaled by the mean of its head gates (ones: unchanged)."""
        self._hold(batch)
        out = self.vectors(batch)
        if batch.head_gates is None:
            return out
        return out * batch.head_gates.reshape(len(batch), -1).mean(1, keepdims=True)

    def warmup(self) -> None:
        pass


def fake_loader(*backends: FakeBackend):
    """A loader for create_app: the i-th bundle spec gets the i-th fake backend."""
    by_path: dict[str, FakeBackend] = {}

    def load(spec: ModelSpec, settings: Settings) -> FakeBackend:
        key = str(spec.path)
        if key not in by_path:
            by_path[key] = backends[len(by_path)]
        return by_path[key]

    return load
