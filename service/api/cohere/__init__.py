"""Cohere's API (and Jina's rerank, which is Cohere's v1 shape): embed and rerank, v1 and v2.
Errors in Cohere's shape, `{"id": "...", "message": "..."}` (its SDK shows the whole body)."""

import uuid

from pydantic import BaseModel

from service.api.declaration import Dialect, ErrorInfo


class CohereError(BaseModel):
    id: str
    message: str


def cohere_error(e: ErrorInfo) -> dict[str, object]:
    return {"id": str(uuid.uuid4()), "message": e.message}


DIALECT = Dialect("cohere", "Cohere-compatible", cohere_error, CohereError)
