"""Mixedbread's rerank request and answer (mixedbread 0.54)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt

from service.api.fields import Compat, ModelName, Text, check_unicode


class RerankRequest(Compat):
    query: Text
    input: Annotated[list[Text | dict[str, Any]], Field(min_length=1)]
    model: ModelName = None
    rank_fields: list[Text] | None = None
    top_k: Annotated[StrictInt, Field(ge=1)] | None = None
    return_input: StrictBool = False
    rewrite_query: StrictBool = False
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )

    def texts(self) -> list[str]:
        """Each input as text: a string as it is; an object by its rank_fields (default its
        `text`), values joined by a newline, as Mixedbread ranks structured inputs."""
        fields = self.rank_fields or ["text"]
        out = []
        for item in self.input:
            if isinstance(item, str):
                out.append(item)
                continue
            values = [item[f] for f in fields if f in item]
            if not values:
                raise ValueError(f"an input has none of the rank_fields {fields}")
            text = "\n".join(v if isinstance(v, str) else str(v) for v in values)
            check_unicode(text, "an input's rank_fields")
            out.append(text)
        return out


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class RankResult(BaseModel):
    index: int
    score: float
    input: Any = None


class RerankResponse(BaseModel):
    usage: Usage
    model: str
    data: list[RankResult]
    object: Literal["list"]
    top_k: int
    return_input: bool
