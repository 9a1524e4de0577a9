"""Cohere's rerank requests and answers (v1, which Jina's also is, and v2). Compatibility
shapes: unknown fields are ignored; defaults are Cohere's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from service.api.fields import Compat, CompatDimensions, ModelName, Text


class Document(Compat):
    text: Text


class RerankV1Request(Compat):
    """Cohere's v1 and Jina's: documents are strings or {"text": ...}."""

    model: ModelName = None
    query: Text
    documents: Annotated[list[Text | Document], Field(min_length=1)]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool | None = None  # Cohere v1: false; Jina: true (both honoured)
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )

    def texts(self) -> list[str]:
        return [d.text if isinstance(d, Document) else d for d in self.documents]


class RerankV2Request(Compat):
    model: Text  # required by Cohere's v2 API; any name works with one reranker served
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    max_tokens_per_doc: Annotated[StrictInt, Field(ge=1)] = 4096
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    search_units: int | None = None
    input_tokens: int | None = None
    images: int | None = None


class Tokens(BaseModel):
    input_tokens: int | None = None
    output_tokens: int | None = None


class Meta(BaseModel):
    api_version: ApiVersion | None = None
    billed_units: BilledUnits | None = None
    tokens: Tokens | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankV1Response(BaseModel):
    id: str
    results: list[RerankResult]
    model: str | None = None
    usage: RerankUsage | None = None
    meta: Meta | None = None


class RerankV2Response(BaseModel):
    id: str
    results: list[RerankResult]
    meta: Meta | None = None
    object: Literal["rerank"] | None = None


# --- Embed (v1 and v2) -------------------------------------------------------------------

InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
Truncate = Literal["NONE", "START", "END"]


class EmbedV1Request(Compat):
    texts: Annotated[list[Text], Field(min_length=1)]
    model: ModelName = None
    input_type: InputType | None = None
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] | None = None
    truncate: Truncate = "END"


class ImageUrl(Compat):
    url: Text


class TextContent(Compat):
    type: Literal["text"]
    text: Text


class ImageUrlContent(Compat):
    type: Literal["image_url"]
    image_url: ImageUrl


class EmbedInput(Compat):
    """One of Cohere's `inputs`: its content, text and image pieces. headwise takes one piece
    per input (an image-text model embeds a text or an image, not both as one vector)."""

    content: Annotated[
        list[Annotated[TextContent | ImageUrlContent, Field(discriminator="type")]],
        Field(min_length=1),
    ]


class EmbedV2Request(Compat):
    """Cohere's v2 embed: `texts`, `images` (data URIs) or `inputs`, one of them."""

    texts: Annotated[list[Text], Field(min_length=1)] | None = None
    images: Annotated[list[Text], Field(min_length=1)] | None = Field(
        None, description="image data URIs (an image-text model's, CLIP or SigLIP): one vector each"
    )
    inputs: Annotated[list[EmbedInput], Field(min_length=1)] | None = Field(
        None,
        description="each input's content, one piece: {type: text, text} or {type: image_url, "
        "image_url: {url}}; one vector each",
    )
    model: Text  # required by Cohere's v2 API; any name works with one embedder served
    input_type: InputType
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] = ["float"]
    truncate: Truncate = "END"
    output_dimension: CompatDimensions = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> EmbedV2Request:
        given = [k for k in ("texts", "images", "inputs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "send one of texts, images or inputs"
                + (f", not {' and '.join(given)} together" if given else "")
            )
        return self


class EmbeddingsByType(BaseModel):
    float_: list[list[float]] | None = Field(None, alias="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class EmbedFloatsResponse(BaseModel):
    response_type: Literal["embeddings_floats"]
    id: str
    embeddings: list[list[float]]
    texts: list[str]
    meta: Meta | None = None


class EmbedByTypeResponse(BaseModel):
    response_type: Literal["embeddings_by_type"]
    id: str
    embeddings: EmbeddingsByType
    texts: list[str]  # the texts embedded ([] for images)
    meta: Meta | None = None
