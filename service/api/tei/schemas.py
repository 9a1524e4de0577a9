"""TEI's requests and answers (text-embeddings-inference 1.9's OpenAPI document).

Compatibility shapes: unknown fields are ignored, defaults are TEI's. Inputs may be text or, as
TEI allows, arrays of the served model's own token ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictInt

from service.api.fields import (
    Compat,
    CompatDimensions,
    ModelName,
    Text,
    Texts,
    check_unicode,
    is_id,
)

TruncationDirection = Literal["Left", "Right", "left", "right"]


def _inputs(value: Any) -> list[str | list[int]]:
    """TEI's Input: a string, ids, or a list of strings and/or id arrays -> a list of items."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(is_id(v) for v in value)):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of strings, not {type(value).__name__}")
    for i, item in enumerate(value):
        if isinstance(item, str):
            check_unicode(item, f"item {i}")
        elif not (isinstance(item, list) and item and all(is_id(t) and t >= 0 for t in item)):
            raise ValueError(f"item {i} must be a string or an array of token ids")
    return value


Inputs = Annotated[list[str | list[int]], BeforeValidator(_inputs)]


class TruncationOptions(Compat):
    truncate: StrictBool | None = Field(
        None, description="null: the server's auto_truncate (true here); false: 413 when too long"
    )
    truncation_direction: TruncationDirection = "Right"
    prompt_name: Text | None = None

    @property
    def cut(self) -> bool:
        return self.truncate is not False

    @property
    def side(self) -> Literal["left", "right"]:
        return "left" if self.truncation_direction.lower() == "left" else "right"


class EmbedRequest(TruncationOptions):
    inputs: Inputs
    normalize: StrictBool = True
    dimensions: CompatDimensions = None
    instruction: Text | None = Field(
        None,
        description="a task description, formatted as the model card formats a query "
        "(Qwen3-Embedding: 'Instruct: {instruction}\\nQuery:{text}'); instead of a prompt; "
        "refused (422) by a model without an instruction format",
    )


class EmbedAllRequest(TruncationOptions):
    inputs: Inputs


class EmbedSparseRequest(TruncationOptions):
    inputs: Inputs


class SimilarityInput(Compat):
    source_sentence: Text
    sentences: Annotated[list[Text], Field(min_length=1)]


class SimilarityRequest(Compat):
    inputs: SimilarityInput
    parameters: TruncationOptions | None = None


class DecodeRequest(Compat):
    ids: list[Annotated[StrictInt, Field(ge=0)]] | list[list[Annotated[StrictInt, Field(ge=0)]]]
    skip_special_tokens: StrictBool = True

    def arrays(self) -> list[list[int]]:
        ids = self.ids
        return [ids] if ids and isinstance(ids[0], int) else ids  # type: ignore[return-value]


class TokenizeRequest(Compat):
    inputs: Texts
    add_special_tokens: StrictBool = True
    prompt_name: Text | None = None


class RerankRequest(TruncationOptions):
    query: Text
    texts: list[Text]  # empty: TEI's 400 Empty, from the handler
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    model: ModelName = None
    instruction: Text | None = Field(
        None,
        description="a causal LM reranker's instruction in its template (default: the "
        "template's own); refused (422) by a cross-encoder",
    )


def _predict_batch(value: Any) -> tuple[list[list[str]], bool]:
    """TEI's PredictInput -> (a batch of [text] or [a, b], whether it was one input)."""
    if isinstance(value, str):
        check_unicode(value, "the text")
        return [[value]], True
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        for t in value:
            check_unicode(t, "the pair")
        return [value], True
    if isinstance(value, list) and not value:
        return [], False  # TEI's 400 Empty, from the handler
    if isinstance(value, list) and value:
        batch = []
        for i, item in enumerate(value):
            item = [item] if isinstance(item, str) else item
            if not (
                isinstance(item, list)
                and len(item) in (1, 2)
                and all(isinstance(t, str) for t in item)
            ):
                raise ValueError(f"item {i} must be a text, [text] or a pair [text, text]")
            for t in item:
                check_unicode(t, f"item {i}")
            batch.append(item)
        return batch, False
    raise ValueError("must be a text, a pair [text, text], or a list of texts and pairs")


def _predict_inputs(value: Any) -> Any:
    _predict_batch(value)  # validates
    return value


PredictInput = Annotated[str | list[str] | list[str | list[str]], BeforeValidator(_predict_inputs)]


class PredictRequest(TruncationOptions):
    inputs: PredictInput
    raw_scores: StrictBool = False
    model: ModelName = None

    def batch(self) -> tuple[list[str | tuple[str, str]], bool]:
        """The inputs as texts and pairs, and whether it was one input (a flat answer)."""
        rows, single = _predict_batch(self.inputs)
        return [r[0] if len(r) == 1 else (r[0], r[1]) for r in rows], single


# --- Answers -----------------------------------------------------------------------------

EmbedResponse = list[list[float]]
EmbedAllResponse = list[list[list[float]]]


class SparseValue(BaseModel):
    index: Annotated[int, Field(ge=0)]
    value: float


EmbedSparseResponse = list[list[SparseValue]]
SimilarityResponse = list[float]
DecodeResponse = list[str]


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


RerankResponse = list[Rank]


class Prediction(BaseModel):
    label: str
    score: float


PredictResponse = list[Prediction] | list[list[Prediction]]


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = None
    stop: int | None = None


TokenizeResponse = list[list[SimpleToken]]


class ErrorResponse(BaseModel):
    error: str
    error_type: Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]
