"""Cohere's API (and Jina's rerank, which is Cohere's v1 shape): `/v1/rerank`, `/v2/rerank`.
Errors in Cohere's shape, `{"message": "..."}`."""

from pydantic import BaseModel

from service.api.declaration import Dialect, ErrorInfo


class CohereError(BaseModel):
    message: str


def cohere_error(e: ErrorInfo) -> dict[str, object]:
    return {"message": e.message}


DIALECT = Dialect("cohere", "Cohere-compatible", cohere_error, CohereError)
