"""The bundle manifest: the one contract between export (writes it) and the service (reads it).

A pydantic model, so writer and reader cannot drift: export builds a `Manifest` and dumps it,
the service validates the JSON back into one and reads fields, never string keys. `format`
is checked first, so a bundle from another headwise version is refused with both versions named.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.images.preprocessing import ImagePreprocessing

# 4: sparse and multi-vector outputs (Manifest.outputs); graphs over 2 GiB keep their weights in
# external data files (GraphEntry.data); decoders' instruction format and a causal LM
# reranker's template.
FORMAT_VERSION = 4

Task = Literal["embed", "rerank", "classify"]
Pooling = Literal["mean", "cls", "lasttoken"]
GraphKey = Literal["encoder", "attention", "encoder_fp16", "encoder_int8", "encoder_int8_openvino"]
Precision = Literal["fp32", "fp16", "int8"]
GraphInput = Literal["input_ids", "attention_mask", "token_type_ids"]
DEFAULT_INPUTS: tuple[GraphInput, ...] = ("input_ids", "attention_mask")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Parity(Frozen):
    """How one graph compares with its reference on the export probe texts."""

    reference: str
    texts: int
    max_abs_diff: float
    min_cosine: float
    mean_cosine: float
    attention_max_abs_diff: float | None = None


class RetrievalQuality(Frozen):
    """A quantised graph against fp32 where users feel it, on held-out real text (export's
    `quality` module): retrieval of query -> document pairs, in points (0-100), the Spearman
    correlation of pair similarities with fp32's, and cosines to fp32 for information."""

    corpus: str
    pairs: int
    recall_at_1: float
    recall_at_10: float
    mrr: float
    fp32_recall_at_1: float
    fp32_recall_at_10: float
    fp32_mrr: float
    spearman: float
    min_cosine: float
    mean_cosine: float
    # The gate it was held to: at most this many points of recall@10 and MRR lost, at least
    # this Spearman.
    max_drop_allowed: float | None = None
    min_spearman_allowed: float | None = None

    @property
    def max_drop(self) -> float:
        """The larger loss, in points, of recall@10 and MRR (negative: both gained): what the
        gate holds. Recall@1 is reported beside it: one query's top hit flips it by 100/pairs
        points, and MRR already carries the top hits, smoothly."""
        return max(self.fp32_recall_at_10 - self.recall_at_10, self.fp32_mrr - self.mrr)


class Pruning(Frozen):
    """What `headwise export --prune-heads/--prune-ffn` removed, and what its gate measured."""

    removed_heads: list[list[int]]  # per layer, original head indices
    heads_removed: int
    ffn_sizes: list[int]  # per layer, FFN neurons left
    ffn_removed: int
    rounds: int  # scoring rounds
    recovered_steps: int  # distillation steps (0: no recovery)
    training: str  # the pairs that scored (and recovered) it
    training_pairs: int
    quality: RetrievalQuality  # pruned against unpruned on held-out pairs, and the gate


class FileEntry(Frozen):
    file: str
    sha256: str


class DataFile(FileEntry):
    bytes: int


class GraphEntry(FileEntry):
    bytes: int  # the graph file itself
    # A graph whose weights pass what one protobuf holds (2 GiB) keeps them in one external data
    # file beside it (ONNX's external data, which ONNX Runtime reads from the graph's folder).
    data: list[DataFile] = Field(default_factory=list)
    precision: Precision
    op_counts: dict[str, int]
    parity: Parity
    # False for a graph whose attention ONNX Runtime cannot fuse (the reason says which op is
    # missing and why), or that an explicit flag let ship unfused.
    fused: bool = True
    unfused_reason: str | None = None
    kept_fp32: list[str] = Field(default_factory=list)  # int8: nodes left in float32
    quantised: int | None = None  # int8: how many of the graph's MatMul/Attention nodes are int8
    quality: RetrievalQuality | None = None  # int8 of an embedding model: what its gate measured
    # The serving graph's other outputs (sparse, token vectors) against PyTorch, by output name.
    output_parity: dict[str, Parity] = Field(default_factory=dict)
    # The attention graph of this version takes `head_gates` (B, L, h), default ones, each
    # head's output multiplied by its gate (/explain's head importance): how its output with
    # heads gated compares with PyTorch's. None: a graph without gates (re-export for them).
    gated_parity: Parity | None = None

    @property
    def total_bytes(self) -> int:
        """The graph and its external data: what loading it costs."""
        return self.bytes + sum(d.bytes for d in self.data)

    def files(self) -> dict[str, str]:
        """file name -> sha256 of the graph and each of its data files."""
        return {self.file: self.sha256, **{d.file: d.sha256 for d in self.data}}


def placeholders(fmt: str) -> list[str]:
    """The {names} of a str.format string, in order (a malformed one raises ValueError)."""
    return [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]


def check_format(fmt: str, names: tuple[str, ...], what: str) -> str:
    """`fmt` holds each of `names` exactly once and nothing else to fill in."""
    try:
        found = placeholders(fmt)
    except ValueError as exc:
        raise ValueError(f"{what} {fmt!r} is not a format string: {exc}") from None
    if sorted(found) != sorted(names):
        want = ", ".join("{" + n + "}" for n in names)
        raise ValueError(f"{what} {fmt!r} must hold {want} once each (found {found})")
    return fmt


class RerankTemplate(Frozen):
    """How a causal LM reranker (Qwen3-Reranker) reads a pair, as its model card formats it:

        prefix + format(instruction, query, document) + suffix

    prefix and suffix are tokenised on their own and never cut; the middle is cut at its end
    (the document first, then the query) to fit the max length. The score is P(yes) =
    softmax([z_no, z_yes])[1] at the last position: the graph outputs z_yes - z_no."""

    prefix: str
    suffix: str
    format: str
    instruction: str  # the default, when a request sends none
    yes: str
    no: str
    yes_id: int
    no_id: int

    @field_validator("format")
    @classmethod
    def _three_fields(cls, value: str) -> str:
        return check_format(value, ("instruction", "query", "document"), "the template's format")


class Source(Frozen):
    """Where the weights came from: a folder, a Hub repository (with its revision), a package."""

    kind: Literal["folder", "hub", "package", "random"] = "folder"
    id: str
    revision: str | None = None


class SpecialTokens(Frozen):
    cls: int | None = None
    sep: int | None = None
    pad: int = 0


Output = Literal["dense", "sparse", "multi_vector"]
DENSE: tuple[Output, ...] = ("dense",)


class SparseOutput(Frozen):
    """How the serving graph's sparse output becomes {vocabulary id: weight} for a text.

    token_weights (bge-m3): one weight per token (B, N); an id's weight is the largest of its
    tokens', and `dropped_ids` (the special tokens FlagEmbedding drops) never answer.
    vocabulary (SPLADE): the pooled vector itself (B, V); its nonzero entries answer."""

    kind: Literal["token_weights", "vocabulary"]
    graph_output: str
    dropped_ids: list[int] = Field(default_factory=list)
    pooling: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"


class MultiVectorOutput(Frozen):
    """One unit vector per token (B, N, dim), and which tokens a text answers with.

    bge-m3: every real token but the first. PyLate's ColBERT: a marker token goes in after the
    first (query or document), a text is cut to its kind's length (marker included); a
    document's `skip_ids` (punctuation) leave no vector; a query with expansion is padded to
    query_length with `expansion_id` ([MASK]), attended to or not, each position a vector."""

    graph_output: str
    dim: int
    skip_first: bool = False
    skip_ids: list[int] = Field(default_factory=list)
    query_marker: int | None = None
    document_marker: int | None = None
    query_length: int | None = None
    document_length: int | None = None
    query_expansion: bool = False
    attend_to_expansion: bool = False
    expansion_id: int | None = None


class VisionTower(Frozen):
    """An image-text model's vision tower (CLIP, SigLIP): its graphs, how an image becomes its
    pixel_values (the checkpoint's preprocessor_config.json, applied by service/images), and
    its numbers. Its image vectors live in the text tower's space (Manifest.dimensions)."""

    architecture: str
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int
    image_size: int
    patch_size: int
    channels: int = 3
    class_token: bool  # CLIP's first token; SigLIP has none
    pooling: Literal["cls", "map"]  # the class token's vector, or SigLIP's attention pooling
    # "encoder": pixel_values (B, C, H, W) -> image_embeds (B, dim), fused; "attention": and
    # every layer's maps (L, B, h, N, N) (and MAP's probe map (B, h, 1, N)), with head_gates.
    graphs: dict[GraphKey, GraphEntry]
    preprocessing: ImagePreprocessing
    probe_images: int

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens(self) -> int:
        """The sequence its layers run: the patches (and the class token first)."""
        return self.grid**2 + int(self.class_token)


class ZeroShot(Frozen):
    """How an image-text model turns image-label similarities into probabilities, as its model
    card does: logit = cos(image, text) · scale + bias; CLIP softmaxes over the labels, SigLIP
    takes each label's sigmoid on its own."""

    probabilities: Literal["softmax", "sigmoid"]
    scale: float  # exp(logit_scale)
    bias: float = 0.0
    template: str = "This is a photo of {label}."  # a label's text (transformers' pipeline's)

    @field_validator("template")
    @classmethod
    def _one_label(cls, value: str) -> str:
        return check_format(value, ("label",), "the zero-shot template")


class Manifest(Frozen):
    format: int = FORMAT_VERSION
    name: str
    source: Source
    task: Task = "embed"
    architecture: str = "bert"
    num_layers: int
    num_heads: int
    d_model: int
    head_dim: int | None = None  # a head's size; None: d_model // num_heads (Gemma's differs)
    d_ff: int
    vocab_size: int
    max_length: int
    # Embedding models: how token vectors become one vector (in the graph), and whether the
    # model's reference pipeline (sentence-transformers' Normalize module) L2-normalises it.
    # `normalize` is the default of /encode's `normalize` when a request leaves it out.
    pooling: Pooling = "mean"
    normalize: bool = False
    # The graph's output width when it is not d_model: the labels, or the last Dense module's.
    output_dim: int | None = None
    # sentence-transformers' prompts: name -> text prepended to the input.
    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None
    # How a request's free `instruction` wraps a query (Qwen3-Embedding:
    # "Instruct: {instruction}\nQuery:{text}"); None: the model takes no instruction.
    instruction_format: str | None = None
    # A causal LM reranker's template (task rerank); None: pairs as the tokenizer pairs them.
    rerank_template: RerankTemplate | None = None
    # Rerank / classify: one entry per output logit, and the activation the scores get.
    labels: list[str] = Field(default_factory=list)
    problem_type: Literal["single_label", "multi_label", "regression"] | None = None
    special_tokens: SpecialTokens = SpecialTokens()
    opset: int
    inputs: list[GraphInput] = Field(default_factory=lambda: list(DEFAULT_INPUTS))
    attention_mask_format: str = "raw 2-D mask (left or right padding)"
    graphs: dict[GraphKey, GraphEntry]
    tokenizer: FileEntry
    probe_texts: int
    versions: dict[str, str] = Field(default_factory=dict)
    created: int = 0  # unix seconds when the bundle was exported
    export_seconds: float = 0.0
    # An embedding model's outputs, from one forward pass: the pooled vector ("dense"), a sparse
    # {id: weight} ("sparse": bge-m3's lexical weights, SPLADE), token vectors ("multi_vector":
    # bge-m3's, ColBERT's). The first is what /encode answers when a request names none.
    outputs: list[Output] = Field(default_factory=lambda: list(DENSE))
    pruning: Pruning | None = None  # a pruned model: what was removed and the gate's figures
    sparse: SparseOutput | None = None
    multi_vector: MultiVectorOutput | None = None
    # An image-text model (CLIP, SigLIP): the graphs above are its text tower; its vision tower
    # and zero-shot classification here. "max_length": every text is padded to max_length and
    # every position attended (SigLIP's model card); "longest": batches pad as usual.
    vision: VisionTower | None = None
    zero_shot: ZeroShot | None = None
    text_padding: Literal["longest", "max_length"] = "longest"

    @field_validator("instruction_format")
    @classmethod
    def _instruction_and_text(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_format(value, ("instruction", "text"), "instruction_format")

    @property
    def dimensions(self) -> int:
        return self.output_dim or self.d_model

    def files(self) -> dict[str, str]:
        """file name -> sha256 for every file the manifest lists (external data included)."""
        graphs = [*self.graphs.values(), *(self.vision.graphs.values() if self.vision else ())]
        listed = {name: sha for g in graphs for name, sha in g.files().items()}
        listed[self.tokenizer.file] = self.tokenizer.sha256
        return listed
