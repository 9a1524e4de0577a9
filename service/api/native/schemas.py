"""headwise's own requests and answers: strict (an unknown field is a 422 naming it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt

from service.api.fields import Dimensions, ModelName, Strict, Text, Texts


class EncodeRequest(Strict):
    inputs: Texts = Field(description="a text or a list of texts")
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


class EncodeResponse(BaseModel):
    embeddings: list[list[float]]
    model: str
    dimensions: int
    tokens: list[int] = Field(description="tokens per input, after truncation")


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
    input: Text
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
    tokens: list[str]
    token_ids: list[int]
    offsets: list[list[int]]
    truncated: bool
    layers: list[int]
    heads: list[int]
    stats: list[HeadStats]
    importance: Importance
    attentions: list[list[list[list[float]]]] | CompactMaps
    sequence_ids: list[int | None] | None = None
    boundary: int | None = None
    embedding: list[float] | None = None
