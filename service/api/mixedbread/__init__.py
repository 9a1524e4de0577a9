"""Mixedbread's rerank API, as its SDK (`mixedbread`) calls it: `/v1/reranking`. Its SDK shows
an error's whole body; the legacy one reads `type` and `message`."""

from pydantic import BaseModel

from service.api.declaration import Dialect, ErrorInfo


class MixedbreadError(BaseModel):
    type: str
    message: str


def mixedbread_error(e: ErrorInfo) -> dict[str, object]:
    kind = "bad_request_error" if e.status == 400 else e.kind
    return {"type": kind, "message": e.message}


DIALECT = Dialect("mixedbread", "Mixedbread-compatible", mixedbread_error, MixedbreadError)
