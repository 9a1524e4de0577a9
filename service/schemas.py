"""Request models. Responses are built as plain dicts and serialised with orjson (fast)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr


def _check_unicode(text: str, what: str) -> None:
    """JSON may carry lone surrogates (\\ud800) that are not valid Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is invalid Unicode: unpaired surrogate at {exc.start}") from None


def _texts(value: Any) -> str | list[str]:
    """A string or a list of strings, with an error that says which item is wrong and why."""
    if isinstance(value, str):
        _check_unicode(value, "the text")
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of strings, not {type(value).__name__}")
    for i, item in enumerate(value):
        if isinstance(item, str):
            _check_unicode(item, f"item {i}")
            continue
        if isinstance(item, int | list) and not isinstance(item, bool):
            raise ValueError(
                f"item {i} is not a string: token-id arrays are not accepted, send text"
            )
        raise ValueError(f"item {i} must be a string, not {type(item).__name__}")
    return value


def _one_text(value: Any) -> Any:
    if isinstance(value, str):
        _check_unicode(value, "the text")
    return value


Texts = Annotated[str | list[str], BeforeValidator(_texts)]


def _texts_or_ids(value: Any) -> str | list[str] | list[list[int]]:
    """OpenAI's `input`: text(s), or an array of token ids, or an array of such arrays."""
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids or not all(_is_id(t) for t in ids):
                raise ValueError(f"item {i} must be a non-empty array of integer token ids")
        return value
    return _texts(value)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


TextsOrIds = Annotated[
    str | list[str] | list[list[int]], BeforeValidator(_texts_or_ids)
]


class Strict(BaseModel):
    """headwise's own routes: an unknown field is a 422 naming it."""

    model_config = ConfigDict(extra="forbid")


class Compat(BaseModel):
    """Compatibility routes (OpenAI, TEI, Cohere/Jina shapes): unknown fields are ignored, as
    their upstreams do, so that clients adding their own fields keep working."""

    model_config = ConfigDict(extra="ignore")


ModelName = Annotated[StrictStr | None, Field(description="served model; default: the first")]


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
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="keep the first k components (Matryoshka), then re-normalise"
    )
    prompt_name: StrictStr | None = Field(
        None, description="one of the model's prompts (sentence-transformers); default: its own"
    )


class OpenAIEmbeddingsRequest(Compat):
    input: TextsOrIds = Field(
        description="text(s), or cl100k_base token-id array(s) as OpenAI's clients send them"
    )
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    user: StrictStr | None = None
    prompt_name: StrictStr | None = None

    def token_arrays(self) -> list[list[int]] | None:
        inp = self.input
        if isinstance(inp, list) and inp and isinstance(inp[0], list):
            return inp  # type: ignore[return-value]
        return None


class TokenizeRequest(Strict):
    inputs: Texts
    model: ModelName = None
    add_special_tokens: StrictBool = True


class AttentionRequest(Strict):
    input: Annotated[StrictStr, BeforeValidator(_one_text)]
    pair: Annotated[StrictStr, BeforeValidator(_one_text)] | None = Field(
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
