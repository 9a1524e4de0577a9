"""Domain errors: what went wrong, in words, with the HTTP status it maps to.

Raised anywhere (pipelines, the registry, the middleware); rendered into a response in exactly
one place, `service.http.errors`, in the shape of the route's dialect. A 500 never carries
internals there: the detail goes to the log with the request id.
"""

from __future__ import annotations


class Disconnected(Exception):
    """The caller went away; its work was dropped. Answered 499 (nobody reads it)."""


class HeadwiseError(Exception):
    status = 500
    kind = "internal_error"
    code: str | None = None  # OpenAI's machine-readable code; the status when None

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.param = param
        self.headers = headers or {}

    @classmethod
    def of_status(cls, status: int, kind: str, message: str, **kw: object) -> HeadwiseError:
        """An error with a status decided at run time (Starlette's 404/405, validation)."""
        err = cls(message, **kw)  # type: ignore[arg-type]
        err.status, err.kind = status, kind
        return err


class InvalidInput(HeadwiseError):
    status, kind = 422, "invalid_request_error"


class EmptyBatch(HeadwiseError):
    """A batch with nothing in it, where a dialect answers that apart (TEI: 400, Empty)."""

    status, kind = 400, "empty"


class RequestTimeout(HeadwiseError):
    status, kind = 408, "request_timeout"


class PayloadTooLarge(HeadwiseError):
    status, kind = 413, "payload_too_large"


class UnsupportedMediaType(HeadwiseError):
    status, kind = 415, "unsupported_media_type"


class HeadersTooLarge(HeadwiseError):
    status, kind = 431, "request_header_fields_too_large"


class Unauthorized(HeadwiseError):
    status, kind = 401, "authentication_error"


class ModelNotFound(HeadwiseError):
    status, kind, code = 404, "invalid_request_error", "model_not_found"


class WrongTask(HeadwiseError):
    """The named model exists but does another task than the route asks for."""

    status, kind, code = 400, "invalid_request_error", "model_task_mismatch"


class Unsupported(HeadwiseError):
    """The model cannot do what the request asks here (its bundle, or a switched-off feature)."""

    status, kind, code = 400, "invalid_request_error", "unsupported_by_model"


class Overloaded(HeadwiseError):
    status, kind = 429, "overloaded"


class Unavailable(HeadwiseError):
    """Not ready, shutting down, or the request's deadline passed."""

    status, kind = 503, "unavailable"


class InferenceFailed(HeadwiseError):
    status, kind = 500, "inference_error"
