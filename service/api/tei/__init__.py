"""TEI's API (text-embeddings-inference): same paths, shapes and status codes, so that a client
written for TEI works against headwise unmodified. Errors in TEI's shape,
`{"error": "...", "error_type": "Validation" | "Empty" | "Overloaded" | "Unhealthy" | "Backend"}`."""

from service.api.declaration import Dialect, ErrorInfo
from service.api.tei.schemas import ErrorResponse


def error_type(status: int, kind: str = "") -> str:
    """TEI's ErrorType for a status code (and headwise's kind of error)."""
    if kind == "empty":
        return "Empty"
    if status == 429:
        return "Overloaded"
    if status == 503:
        return "Unhealthy"
    if status >= 500:
        return "Backend"
    return "Validation"


def tei_error(e: ErrorInfo) -> dict[str, object]:
    return {"error": e.message, "error_type": error_type(e.status, e.kind)}


DIALECT = Dialect("tei", "TEI-compatible", tei_error, ErrorResponse)
