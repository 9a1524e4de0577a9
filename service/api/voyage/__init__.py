"""Voyage AI's API, as its SDK calls it: rerank on `/v1/rerank` (beside Cohere's v1, told apart
by the body), embed on `/v1/embeddings` (beside OpenAI's), and multimodal embed on an image-text
model (`multimodal_embed`, one text or one image an input). Its SDK reads an error's `detail`,
a string."""

from pydantic import BaseModel

from service.api.declaration import Dialect, ErrorInfo


class VoyageError(BaseModel):
    detail: str


def voyage_error(e: ErrorInfo) -> dict[str, object]:
    return {"detail": e.message}


DIALECT = Dialect("voyage", "Voyage-compatible", voyage_error, VoyageError)

