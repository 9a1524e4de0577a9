"""Request models of TEI's API (text-embeddings-inference 1.9's OpenAPI document).

Compatibility shapes: unknown fields are ignored, defaults are TEI's. Inputs may be text or,
as TEI allows, arrays of the served model's own token ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from service.schemas import Compat, Texts, _check_unicode, _is_id

Direction = Literal["Left", "Right", "left", "right"]


def _inputs(value: Any) -> list[str | list[int]]:
    """TEI's Input: a string, ids, or a list of strings and/or id arrays -> a list of items."""
    if isinstance(value, str) or (
        isinstance(value, list) and value and all(_is_id(v) for v in value)
    ):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of strings, not {type(value).__name__}")
    for i, item in enumerate(value):
        if isinstance(item, str):
            _check_unicode(item, f"item {i}")
        elif not (isinstance(item, list) and item and all(_is_id(t) and t >= 0 for t in item)):
            raise ValueError(f"item {i} must be a string or an array of token ids")
    return value


Inputs = Annotated[list[str | list[int]], BeforeValidator(_inputs)]


class TruncationOptions(Compat):
    truncate: StrictBool | None = Field(
        None, description="null: the server's auto_truncate (true here); false: 413 when too long"
    )
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None

    @property
    def cut(self) -> bool:
        return self.truncate is not False

    @property
    def direction(self) -> Literal["left", "right"]:
        return "left" if self.truncation_direction.lower() == "left" else "right"


class EmbedRequest(TruncationOptions):
    inputs: Inputs
    normalize: StrictBool = True
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None


class EmbedAllRequest(TruncationOptions):
    inputs: Inputs


class SimilarityInput(BaseModel):
    source_sentence: StrictStr
    sentences: Annotated[list[StrictStr], Field(min_length=1)]


class SimilarityRequest(Compat):
    inputs: SimilarityInput
    parameters: TruncationOptions | None = None


class DecodeRequest(Compat):
    ids: list[Annotated[StrictInt, Field(ge=0)]] | list[list[Annotated[StrictInt, Field(ge=0)]]]
    skip_special_tokens: StrictBool = True

    def arrays(self) -> list[list[int]]:
        ids = self.ids
        return [ids] if ids and isinstance(ids[0], int) else ids  # type: ignore[list-item,return-value]


class TokenizeRequest(Compat):
    inputs: Texts
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None
