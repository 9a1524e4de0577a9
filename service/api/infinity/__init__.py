"""Infinity's own API (michaelfeil/infinity), as `infinity_client` calls it: `/embeddings` and
`/models` without OpenAI's `/v1`, and `/rerank` with its `documents` body (beside TEI's on the
same path, told apart by the body). Errors in OpenAI's shape, as Infinity's."""

from service.api.declaration import Dialect
from service.api.shapes import OpenAIError, openai_error

DIALECT = Dialect("infinity", "Infinity-compatible", openai_error, OpenAIError)
# What infinity_client sends when the caller names no model.
UNSET_MODEL = "default/not-specified"
