"""The Open Inference Protocol v2 over HTTP (KServe's v2 protocol, Triton's HTTP API): server and
model metadata, readiness per model, and `infer` with JSON tensors or Triton's binary tensor
extension, both ways. Errors in the protocol's shape, `{"error": "..."}`."""

from pydantic import BaseModel

from service.api.declaration import Dialect, ErrorInfo


class ErrorResponse(BaseModel):
    error: str


def oip_error(e: ErrorInfo) -> dict[str, object]:
    return {"error": e.message}


DIALECT = Dialect("oip", "Open Inference Protocol v2 (KServe, Triton)", oip_error, ErrorResponse)
