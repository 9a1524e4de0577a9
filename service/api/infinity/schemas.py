"""Infinity's requests and answers (infinity_emb 0.0.78's pymodels)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictInt

from service.api.fields import Compat, CompatDimensions, Text, Texts
from service.api.infinity import UNSET_MODEL

# The field by which a body on the shared rerank path is Infinity's (TEI's has `texts`).
RERANK_KEY = "documents"


def _unset(value: Any) -> Any:
    return None if value == UNSET_MODEL else value


ModelOrUnset = Annotated[Text | None, BeforeValidator(_unset)]


class EmbeddingsRequest(Compat):
    input: Texts = Field(
        description="text(s); with modality image, image URLs or data URIs (an image-text "
        "model's, CLIP or SigLIP)"
    )
    model: ModelOrUnset = None
    encoding_format: Literal["float", "base64"] = "float"
    user: Text | None = None
    dimensions: CompatDimensions = None
    modality: Literal["text", "image"] = "text"


class Embedding(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | str
    index: int


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage
    id: str
    created: int


class RerankRequest(Compat):
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)]
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    model: ModelOrUnset = None
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )


class RerankResult(BaseModel):
    relevance_score: float
    index: int
    document: str | None = None


class RerankResponse(BaseModel):
    object: Literal["rerank"]
    results: list[RerankResult]
    model: str
    usage: Usage
    id: str
    created: int


class ModelStats(BaseModel):
    queue_fraction: float
    queue_absolute: int
    results_pending: int
    batch_size: int


class ModelInfo(BaseModel):
    id: str
    stats: ModelStats
    object: Literal["model"]
    owned_by: Literal["infinity"]
    created: int
    backend: str
    capabilities: list[str]


class ModelList(BaseModel):
    data: list[ModelInfo]
    object: Literal["list"]
