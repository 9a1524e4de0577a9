"""Request field types every dialect uses: texts (checked for valid Unicode), model names, and
the two base models: headwise's strict one and the compatibility one."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    model_validator,
)


def check_unicode(text: str, what: str) -> None:
    """JSON may carry lone surrogates (\\ud800) that are not valid Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is invalid Unicode: unpaired surrogate at {exc.start}") from None


def _text(value: Any) -> Any:
    if isinstance(value, str):
        check_unicode(value, "the text")
    return value


def parse_texts(value: Any) -> str | list[str]:
    """A string or a list of strings, with an error that says which item is wrong and why."""
    if isinstance(value, str):
        check_unicode(value, "the text")
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of strings, not {type(value).__name__}")
    for i, item in enumerate(value):
        if isinstance(item, str):
            check_unicode(item, f"item {i}")
            continue
        if isinstance(item, int | list) and not isinstance(item, bool):
            raise ValueError(
                f"item {i} is not a string: token-id arrays are not accepted, send text"
            )
        raise ValueError(f"item {i} must be a string, not {type(item).__name__}")
    return value


def is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unset_if_zero(value: Any) -> Any:
    """Clients send 0 for "not set" (dimensions: 0); the upstreams read it so."""
    return None if value == 0 and is_id(value) else value


Text = Annotated[StrictStr, BeforeValidator(_text)]
Texts = Annotated[str | list[str], BeforeValidator(parse_texts)]
ModelName = Annotated[
    Text | None, Field(description="the served model to use; default: the first that can")
]
# Matryoshka: keep the first k components; null: all of them. Compatibility routes also read
# 0 as "not set", as their clients send it (infinity_client always does) and upstreams read it.
Dimensions = Annotated[StrictInt, Field(ge=1)] | None
CompatDimensions = Annotated[Dimensions, BeforeValidator(_unset_if_zero)]


class Strict(BaseModel):
    """headwise's own routes: an unknown field is a 422 naming it."""

    model_config = ConfigDict(extra="forbid")


class Compat(BaseModel):
    """Compatibility routes (OpenAI, TEI, Cohere, ... shapes): unknown fields are ignored, as
    their upstreams do, so that clients adding their own fields keep working; an optional field
    sent as null means its default, as clients that serialise every field expect."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {
                k: v
                for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required()
            }
        return data
