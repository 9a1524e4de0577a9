"""Error bodies shared by dialects that use OpenAI's shape (headwise's own, OpenAI's)."""

from __future__ import annotations

from pydantic import BaseModel

from service.api.declaration import ErrorInfo


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class OpenAIError(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`: what OpenAI's SDKs show."""

    error: OpenAIErrorDetail


def openai_error(e: ErrorInfo) -> dict[str, object]:
    return {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code or e.status}}
