"""Voyage's rerank and embed requests and answers (voyageai 0.5)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from service.api.fields import Compat, CompatDimensions, ModelName, Text, Texts

# The fields by which a body is Voyage's rather than its neighbour's on the same path.
RERANK_KEYS = ("top_k", "truncation")
EMBED_KEYS = ("input_type", "truncation", "output_dtype", "output_dimension")
VOYAGE_ROLES = ("query", "document")


def is_voyage_embed(body: Any) -> int:
    """1 when a /v1/embeddings body is Voyage's, 0 when it is OpenAI's. Voyage's own fields say
    so, but `input_type` alone does not: OpenAI-compatible clients (NVIDIA's, and others) add it
    to OpenAI's request. A body that asks `encoding_format: "float"` (Voyage accepts only
    base64 or none) or a role Voyage does not have ("passage") is OpenAI's."""
    if not isinstance(body, dict) or not any(k in body for k in EMBED_KEYS):
        return 0
    if any(k in body for k in EMBED_KEYS if k != "input_type"):
        return 1
    if body.get("encoding_format") == "float":
        return 0
    return int(body.get("input_type") in (*VOYAGE_ROLES, None))


class RerankRequest(Compat):
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)]
    model: ModelName = None
    top_k: Annotated[StrictInt, Field(ge=1)] | None = None
    truncation: StrictBool = True
    return_documents: StrictBool = False
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )


class RerankResult(BaseModel):
    relevance_score: float
    index: int
    document: str | None = None


class Usage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    object: Literal["list"]
    data: list[RerankResult]
    model: str
    usage: Usage


OutputDtype = Literal["float", "int8", "uint8", "binary", "ubinary"]


class EmbeddingsRequest(Compat):
    input: Texts
    model: ModelName = None
    input_type: Literal["query", "document"] | None = None
    truncation: StrictBool = True
    output_dtype: OutputDtype = "float"
    output_dimension: CompatDimensions = None
    encoding_format: Literal["base64"] | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | list[int] | str
    index: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


# --- Multimodal embed (/v1/multimodalembeddings) -----------------------------------------


class TextPiece(Compat):
    type: Literal["text"]
    text: Text


class ImageUrlPiece(Compat):
    type: Literal["image_url"]
    image_url: Text


class ImageBase64Piece(Compat):
    type: Literal["image_base64"]
    image_base64: Text = Field(description="a data URI: data:image/png;base64,...")


Piece = Annotated[TextPiece | ImageUrlPiece | ImageBase64Piece, Field(discriminator="type")]


class MultimodalInput(Compat):
    content: Annotated[list[Piece], Field(min_length=1)]


class MultimodalRequest(Compat):
    """Voyage's multimodal embed. Voyage reads an input's pieces (interleaved text and images)
    as one sequence, one vector; an image-text model (CLIP, SigLIP) embeds a text or an image
    on its own tower, so headwise takes one piece per input (several: a 422 saying so).
    `input_type` picks the model's query/document prompt for texts; images have no prompt."""

    inputs: Annotated[list[MultimodalInput], Field(min_length=1)]
    model: ModelName = None
    input_type: Literal["query", "document"] | None = None
    truncation: StrictBool = True
    output_encoding: Literal["base64"] | None = None
    encoding_format: Literal["base64"] | None = Field(
        None, description="what voyageai's SDK sends for output_encoding"
    )
    output_dtype: OutputDtype = "float"
    output_dimension: CompatDimensions = None

    @model_validator(mode="after")
    def _one_image_form(self) -> MultimodalRequest:
        """Voyage's rule: a request's images are all URLs or all base64, not both."""
        kinds = {type(p) for i in self.inputs for p in i.content} - {TextPiece}
        if len(kinds) > 1:
            raise ValueError("send images as image_url or as image_base64, not both in one request")
        return self

    @property
    def base64(self) -> bool:
        return (self.output_encoding or self.encoding_format) == "base64"


class MultimodalUsage(BaseModel):
    text_tokens: int
    image_pixels: int
    video_pixels: int
    total_tokens: int


class MultimodalResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: MultimodalUsage
