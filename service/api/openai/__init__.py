"""OpenAI's embeddings API: `/v1/embeddings` and the model list, as its SDK (and LangChain,
LlamaIndex, litellm, Haystack through it) calls them."""

from service.api.declaration import Dialect
from service.api.shapes import OpenAIError, openai_error

DIALECT = Dialect("openai", "OpenAI-compatible", openai_error, OpenAIError)
