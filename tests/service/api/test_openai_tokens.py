"""cl100k_base token ids -> text, from the encoding file installed with the service."""

from __future__ import annotations

import asyncio

import pytest

from service.api.openai.tokens import cl100k, decode_cl100k, texts_from_token_ids
from service.errors import InvalidInput


def test_ids_decode_to_the_text_tiktoken_encoded():
    enc = cl100k()
    texts = ["Hello, world!", "Café — naïve 😍", "東京は日本の首都です。", ""]
    assert decode_cl100k([enc.encode(t) for t in texts]) == texts
    assert enc.n_vocab == 100277


def test_ids_outside_the_vocabulary_are_named():
    with pytest.raises(InvalidInput, match=r"input\[1\].*0..100276.*\[200000\]"):
        decode_cl100k([[1, 2], [200000]])


def test_turned_off_the_error_says_what_a_langchain_user_changes():
    with pytest.raises(InvalidInput, match="check_embedding_ctx_length=False"):
        asyncio.run(texts_from_token_ids([[1, 2]], enabled=False))
