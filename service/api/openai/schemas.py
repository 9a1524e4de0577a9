"""OpenAI's embeddings request and answer, and its model list."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from service.api.fields import Compat, CompatDimensions, ModelName, Text, is_id, parse_texts


def _texts_or_ids(value: Any) -> str | list[str] | list[list[int]]:
    """OpenAI's `input`: text(s), or an array of token ids, or an array of such arrays."""
    if isinstance(value, list) and value and all(is_id(v) for v in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids or not all(is_id(t) for t in ids):
                raise ValueError(f"item {i} must be a non-empty array of integer token ids")
        return value
    return parse_texts(value)


TextsOrIds = Annotated[str | list[str] | list[list[int]], BeforeValidator(_texts_or_ids)]


class EmbeddingsRequest(Compat):
    input: TextsOrIds = Field(
        description="text(s), or cl100k_base token-id array(s) as OpenAI's clients send them"
    )
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: CompatDimensions = None
    user: Text | None = None
    prompt_name: Text | None = None
    input_type: Literal["query", "passage", "document"] | None = Field(
        None,
        description="the text's role, as NVIDIA's and other OpenAI-compatible clients send it: "
        "the model's prompt for it (passage: its document prompt)",
    )
    truncate: Literal["NONE", "START", "END"] = Field(
        "END",
        description="NVIDIA's: cut an input past the model's length at its end (END) or start "
        "(START), or refuse it (NONE: 413)",
    )

    def token_arrays(self) -> list[list[int]] | None:
        inp = self.input
        if isinstance(inp, list) and inp and isinstance(inp[0], list):
            return inp
        return None


# The field by which a /v1/embeddings body is vLLM's chat form rather than OpenAI's `input`.
CHAT_KEY = "messages"


class ImageUrl(Compat):
    url: Text


class TextPart(Compat):
    type: Literal["text"]
    text: Text


class ImagePart(Compat):
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(Compat):
    role: Text
    content: Text | list[Part]


class ChatEmbeddingsRequest(Compat):
    """vLLM's chat embeddings: `messages` (chat's schema) in place of `input`, one prompt, one
    vector. As vLLM serves CLIP and SigLIP, the prompt is text only, or one image only; its text
    is what vLLM's basic chat template renders: each message's text parts joined with newlines,
    the messages one after another (roles are not read)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: CompatDimensions = None
    user: Text | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
