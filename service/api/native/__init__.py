"""headwise's own API: `/encode`, `/tokenize/details`, `/attention` and its viewer. Errors in
OpenAI's shape, so that the SDKs people already hold show the message."""

from service.api.declaration import Dialect
from service.api.shapes import OpenAIError, openai_error

DIALECT = Dialect("headwise", "headwise", openai_error, OpenAIError)
