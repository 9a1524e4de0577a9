"""headwise's own requests and answers: strict (an unknown field is a 422 naming it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    WithJsonSchema,
    model_validator,
)

from service.api.fields import Dimensions, ModelName, Strict, Text, Texts

Output = Literal["dense", "sparse", "multi_vector"]


class ChunkingOptions(Strict):
    """How to cut each input into chunks, and how to embed them (README: Long documents)."""

    strategy: Literal["late", "separate"] = Field(
        "late",
        description="late: the document runs once, each chunk the mean of its own tokens' "
        "states (it sees its context); separate: each chunk's text on its own",
    )
    size: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="tokens a chunk; or give chunks (character spans) instead"
    )
    overlap: Annotated[StrictInt, Field(ge=0)] = Field(0, description="tokens two chunks share")
    pool: StrictBool = Field(
        False, description="also one vector for the whole document (token-weighted mean)"
    )


Span = Annotated[list[StrictInt], Field(min_length=2, max_length=2)]


class EncodeOutputs(Strict):
    """/encode's outputs besides the dense vector: a model's sparse and token-vector outputs
    (bge-m3, SPLADE, ColBERT), any of them from one forward pass."""

    outputs: Annotated[list[Output], Field(min_length=1)] | None = Field(
        None,
        description="what to answer: dense (embeddings), sparse ({index, value} per vocabulary "
        "id), multi_vector (one vector per token); default: the model's first output (its "
        "dense vector when it has one). A model without an asked output is a 400 naming its own",
    )
    sparse_tokens: StrictBool = Field(
        False, description="each sparse entry also carries its token's text"
    )
    input_type: Literal["query", "document"] | None = Field(
        None,
        description="a ColBERT model encodes a query (its marker, expanded to its query length) "
        "and a document (its marker, its skiplist) differently; default document. Other models: "
        "the model's prompt for that role, when prompt_name is not given",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="multi_vector as nested arrays (float), or per input "
        '{"encoding": "base64", "dtype": "<f4", "shape": [n, d], "data"}: little-endian float32',
    )


ImageRef = Annotated[
    str,
    Field(
        min_length=1,
        description="an image: a data URI (data:image/png;base64,...), base64 bytes, or an "
        "http(s) URL of a host the operator allows (HEADWISE_IMAGE_URL_HOSTS)",
    ),
]


class EncodeRequest(EncodeOutputs):
    inputs: Texts | None = Field(
        None, description="a text or a list of texts (or none, with images)"
    )
    images: Annotated[list[ImageRef], Field(min_length=1)] | None = Field(
        None,
        description="images, for an image-text model (CLIP, SigLIP): their vectors follow the "
        "texts' in `embeddings`, in the same space (JPEG, PNG, WebP, GIF's first frame)",
    )
    model: ModelName = None
    normalize: StrictBool | None = Field(
        None,
        description="L2-normalise each vector; default: as the model's sentence-transformers "
        "pipeline does (its Normalize module)",
    )
    truncate: StrictBool = Field(
        True, description="cut at the model's max length; false: 413 instead"
    )
    dimensions: Dimensions = Field(
        None, description="keep the first k components (Matryoshka), then re-normalise"
    )
    prompt_name: Text | None = Field(
        None, description="one of the model's prompts (sentence-transformers); default: its own"
    )
    instruction: Text | None = Field(
        None,
        description="a task description, formatted as the model card formats a query "
        "(Qwen3-Embedding: 'Instruct: {instruction}\\nQuery:{text}'); instead of a prompt; "
        "refused (422) by a model without an instruction format",
    )
    chunking: ChunkingOptions | None = Field(
        None, description="cut each input into chunks and embed them (no truncation then)"
    )
    chunks: list[Span] | list[list[Span]] | None = Field(
        None,
        description="the chunks as character spans [start, stop] of the input (a list per "
        "input when there are several), snapped to token boundaries",
    )

    @model_validator(mode="after")
    def _something(self) -> EncodeRequest:
        if self.inputs is None and self.images is None:
            raise ValueError("give inputs (texts), images, or both")
        if self.images is not None and (
            self.chunking or self.chunks or self.outputs not in (None, ["dense"])
        ):
            raise ValueError("images are embedded as dense vectors, without chunking")
        return self


class ZeroShotRequest(Strict):
    """/predict on images (an image-text model): each candidate label's probability, as the
    model card computes it (CLIP: softmax over the labels; SigLIP: each label's sigmoid)."""

    image: ImageRef | Annotated[list[ImageRef], Field(min_length=1)] = Field(
        description="an image, or a list of images (then a list of answers)"
    )
    labels: Annotated[list[Text], Field(min_length=1)] = Field(
        description="the candidate labels, each put through the template"
    )
    template: Text | None = Field(
        None,
        description="a label's text, holding {label}; default: the bundle's (transformers' "
        "pipeline's 'This is a photo of {label}.')",
    )
    model: ModelName = None


class ChunkVector(BaseModel):
    start: int
    stop: int
    embedding: list[float]


class SparseEntry(BaseModel):
    index: Annotated[int, Field(ge=0)]
    value: float
    token: str | None = Field(None, description="the token's text, with sparse_tokens")


class CompactVectors(BaseModel):
    encoding: Literal["base64"]
    dtype: Literal["<f4"]
    shape: Annotated[list[int], Field(min_length=2, max_length=2)]
    data: str


class EncodeOutputsAnswer(BaseModel):
    outputs: list[Output] | None = Field(None, description="the outputs answered")
    sparse: list[list[SparseEntry]] | None = Field(
        None, description="per input, its nonzero weights by vocabulary id, sorted by index"
    )
    multi_vector: list[list[list[float]]] | list[CompactVectors] | None = Field(
        None, description="per input, one unit vector per token"
    )


class EncodeResponse(EncodeOutputsAnswer):
    embeddings: list[list[float]] | None = Field(
        None,
        description="per input, with the dense output (with chunking: only with pool, the "
        "document's vector)",
    )
    model: str
    dimensions: int | None = None  # the dense vectors'
    tokens: list[int] = Field(description="tokens per input, after truncation")
    chunks: list[list[ChunkVector]] | None = Field(
        None, description="with chunking: per input, its chunks in order"
    )


class TokenizeDetailsRequest(Strict):
    inputs: Texts
    model: ModelName = None
    add_special_tokens: StrictBool = True


class TokenDetails(BaseModel):
    tokens: list[str]
    ids: list[int]
    offsets: list[list[int]] = Field(description="[start, stop) character spans in the input")
    special: list[bool]
    truncated: bool


class TokenizeDetailsResponse(BaseModel):
    model: str
    results: list[TokenDetails]


class AttentionRequest(Strict):
    input: Text | None = Field(None, description="the text to look at (or give an image)")
    image: ImageRef | None = Field(
        None,
        description="an image, for an image-text model: maps over its patches (CLIP's class "
        "token first), with the picture as the model saw it and its grid",
    )
    pair: Text | None = Field(
        None,
        description="a second text (a cross-encoder's document): maps over the joined pair, "
        "with where it starts",
    )
    model: ModelName = None
    layers: list[StrictInt] | None = Field(None, description="layer indices; all when null")
    heads: list[StrictInt] | None = Field(None, description="head indices; all when null")
    truncate: StrictBool = Field(
        False, description="cut at the attention token limit instead of 413"
    )
    format: Literal["json", "png"] = "json"
    encoding_format: Literal["float", "base64_f16", "base64_f32"] = Field(
        "float",
        description="attentions as nested JSON arrays (float), or compact: base64 of "
        "little-endian float16/float32 with dtype and shape [layers, heads, n, n]",
    )

    @model_validator(mode="after")
    def _text_or_image(self) -> AttentionRequest:
        if (self.input is None) == (self.image is None):
            raise ValueError("give input (a text) or image, one of them")
        if self.image is not None and self.pair is not None:
            raise ValueError("pair goes with a text input, not an image")
        return self


class CompactMaps(BaseModel):
    encoding: Literal["base64"]
    dtype: Literal["<f2", "<f4"]
    shape: Annotated[list[int], Field(min_length=4, max_length=4)]
    data: str


class HeadStats(BaseModel):
    layer: int
    head: int
    entropy: float
    max_weight: float
    cls_mass: float
    sep_mass: float
    mean_distance: float
    diagonal_mass: float


class Importance(BaseModel):
    cls_last_layer: list[float]
    rollout: list[float]


class AttentionResponse(BaseModel):
    model: str
    tokens: list[str] = Field(description="a text's tokens; an image's [CLS] and r{row}c{col}")
    token_ids: list[int] | None = None  # a text's
    offsets: list[list[int]] | None = None  # a text's
    modality: Literal["text", "image"] = "text"
    # An image's: the patch grid (grid x grid patches of patch_size px), the picture as the model
    # saw it (a PNG data URI, image_size px square), SigLIP's pooling probe per head (h, N).
    grid: int | None = None
    patch_size: int | None = None
    image_size: int | None = None
    picture: str | None = None
    pool_attention: list[list[float]] | None = None
    truncated: bool
    layers: list[int]
    heads: list[int]
    stats: list[HeadStats]
    importance: Importance
    attentions: list[list[list[list[float]]]] | CompactMaps
    sequence_ids: list[int | None] | None = None
    boundary: int | None = None
    embedding: list[float] | None = None


FORMS = ("input", "pair", "similarity")
# The forms are documented without null (one of them is sent; null is taken as absent).
TWO_TEXTS = {"type": "array", "prefixItems": [{"type": "string"}] * 2, "minItems": 2, "maxItems": 2}
OneText = Annotated[Text | None, WithJsonSchema({"type": "string"})]
TwoTexts = Annotated[tuple[Text, Text] | None, WithJsonSchema(TWO_TEXTS)]


class ExplainRequest(Strict):
    """Exactly one of `input`, `pair`, `similarity`; or `image` (with `input`, optionally)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"anyOf": [{"required": [f]} for f in (*FORMS, "image")]},
    )

    input: OneText = Field(
        None, description="one text: an embedder's embedding, or a classifier's label"
    )
    pair: TwoTexts = Field(
        None,
        description="[query, document] as one sequence, as /rerank scores it: a reranker's "
        "relevance or a classifier's label (an embedder takes similarity instead: 400)",
    )
    similarity: TwoTexts = Field(
        None, description="[a, b]: an embedder's cosine similarity of two texts"
    )
    image: ImageRef | None = Field(
        None,
        description="an image (an image-text model): which patches its vector rests on, each "
        "left out in turn; with input, which patches its similarity to that text rests on",
    )
    model: ModelName = None
    granularity: Literal["token", "word", "head", "patch"] = Field(
        "token",
        description="leave out one token at a time, one of the tokenizer's words (all its "
        "tokens at once), or one attention head at a time (layer by layer, in every text of "
        "the request at once; on the attention graph); an image's: patch (the default)",
    )
    target: Text | None = Field(
        None, description="a classifier's label to explain; default: its top label"
    )
    truncate: StrictBool = Field(
        True, description="cut at the model's max length; false: 413 instead"
    )

    @model_validator(mode="after")
    def _one_form(self) -> ExplainRequest:
        if self.image is not None:
            if self.pair is not None or self.similarity is not None:
                raise ValueError("an image goes alone, or with input (a text to compare it to)")
            if self.granularity not in ("token", "patch"):
                raise ValueError("an image is explained patch by patch (granularity patch)")
            return self
        if self.granularity == "patch":
            raise ValueError("granularity patch is an image's: send image")
        given = [f for f in FORMS if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(
                "send exactly one of input (a text), pair ([query, document]) or similarity "
                f"([a, b]); got {' and '.join(given) or 'none'}"
            )
        return self

    @property
    def form(self) -> Literal["input", "pair", "similarity"]:
        if self.pair is not None:
            return "pair"
        return "similarity" if self.similarity is not None else "input"

    @property
    def texts(self) -> tuple[str, ...]:
        return self.pair or self.similarity or (self.input or "",)


class ExplainPart(BaseModel):
    text: str = Field(description="the part as it is written in its text")
    start: int = Field(description="[start, stop): character offsets into its text")
    stop: int
    importance: float = Field(description="how much leaving it out changes the output")
    attention: float | None = Field(
        description="attention rollout (as /attention's importance) summed over its tokens; "
        "null when the model has no attention graph here"
    )


class ExplainHead(BaseModel):
    layer: int
    head: int
    importance: float = Field(description="how much leaving the head out changes the output")
    entropy: float = Field(
        description="its attention statistics over the whole text, as "
        "/attention gives them (a similarity's two texts averaged)"
    )
    max_weight: float
    cls_mass: float
    sep_mass: float
    mean_distance: float
    diagonal_mass: float


class ExplainResponse(BaseModel):
    model: str
    granularity: Literal["token", "word", "head"]
    score: float | None = Field(
        None,
        description="unperturbed: the cosine (similarity), the relevance (a reranker's pair), "
        "the target's probability (a classifier); absent for an embedder's one text",
    )
    target: str | None = Field(None, description="the label explained (classifiers)")
    parts: list[list[ExplainPart]] = Field(
        default_factory=list,
        description="one list per text (input: one; pair, similarity: two); special tokens "
        "are no parts; absent for granularity head",
    )
    spearman: list[float | None] = Field(
        default_factory=list,
        description="per text, the rank correlation of importance and attention over its "
        "parts (ties averaged); null where undefined; absent for granularity head",
    )
    heads: list[ExplainHead] | None = Field(
        None, description="granularity head: every head, layer by layer"
    )
    head_spearman: dict[str, float | None] | None = Field(
        None,
        description="granularity head: per attention statistic, its rank correlation with "
        "the heads' importance (ties averaged); null where undefined",
    )
    truncated: bool
    attention_note: str | None = Field(None, description="why attention is null, when it is")
