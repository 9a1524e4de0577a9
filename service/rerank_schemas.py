"""Request models of the reranking and classification APIs people call: TEI's /rerank and
/predict, Cohere's (and Jina's) /v1/rerank, Cohere's /v2/rerank. Compatibility shapes: unknown
fields are ignored; defaults are the upstreams'."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from service.schemas import Compat, ModelName, _check_unicode
from service.tei_schemas import TruncationOptions


def _text(value: Any) -> Any:
    if isinstance(value, str):
        _check_unicode(value, "the text")
    return value


Text = Annotated[StrictStr, BeforeValidator(_text)]


class TeiRerankRequest(TruncationOptions):
    query: Text
    texts: Annotated[list[Text], Field(min_length=1)]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    model: ModelName = None


class Document(Compat):
    text: Text


def _document_text(value: Any) -> Any:
    return value.text if isinstance(value, Document) else value


class CohereV1RerankRequest(Compat):
    """Cohere's v1 and Jina's: documents are strings or {"text": ...}."""

    model: ModelName = None
    query: Text
    documents: Annotated[list[Text | Document], Field(min_length=1)]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool | None = None  # Cohere v1: false; Jina: true (both honoured)

    def texts(self) -> list[str]:
        return [d.text if isinstance(d, Document) else d for d in self.documents]


class CohereV2RerankRequest(Compat):
    model: StrictStr  # required by Cohere's v2 API; any name works with one reranker served
    query: Text
    documents: Annotated[list[Text], Field(min_length=1)]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    max_tokens_per_doc: Annotated[StrictInt, Field(ge=1)] = 4096


def _predict_batch(value: Any) -> tuple[list[list[str]], bool]:
    """TEI's PredictInput -> (a batch of [text] or [a, b], whether it was one input)."""
    if isinstance(value, str):
        return [[value]], True
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return [value], True
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
                _check_unicode(t, f"item {i}")
            batch.append(item)
        return batch, False
    raise ValueError("must be a text, a pair [text, text], or a list of texts and pairs")


def _predict_inputs(value: Any) -> Any:
    _predict_batch(value)  # validates
    return value


PredictInput = Annotated[
    str | list[str] | list[str | list[str]], BeforeValidator(_predict_inputs)
]


class PredictRequest(TruncationOptions):
    inputs: PredictInput
    raw_scores: StrictBool = False
    model: ModelName = None

    def batch(self) -> tuple[list[str | tuple[str, str]], bool]:
        """The inputs as texts and pairs, and whether it was one input (a flat answer)."""
        rows, single = _predict_batch(self.inputs)
        return [r[0] if len(r) == 1 else (r[0], r[1]) for r in rows], single
