"""OpenAI's /v1/embeddings with the fields OpenAI-compatible clients add (NVIDIA's NIM clients,
LangChain's NVIDIA and other integrations): `input_type` picks the model's prompt for the role,
`truncate` (NONE, START, END) cuts or refuses; such a body with `encoding_format: "float"` is
OpenAI's, never taken for Voyage's (Voyage's has no "float" encoding nor a "passage" role)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest


@pytest.fixture(scope="module")
def c():
    backend = FakeBackend(fake_manifest("e5", prompts={"query": "the ", "passage": "a "}))
    with client_for(Path("e"), loader=fake_loader(backend)) as client:
        yield client


def encode(c, text: str) -> np.ndarray:
    return np.array(c.post("/encode", json={"inputs": text, "normalize": True}).json()["embeddings"][0])


@pytest.mark.parametrize(("role", "prompt"), [("query", "the "), ("passage", "a "), ("document", "a ")])
def test_input_type_with_float_encoding_is_openais_and_takes_the_roles_prompt(c, role, prompt):
    r = c.post(
        "/v1/embeddings",
        json={"input": ["cat"], "model": "e5", "encoding_format": "float", "input_type": role},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and set(body["usage"]) == {"prompt_tokens", "total_tokens"}
    np.testing.assert_allclose(body["data"][0]["embedding"], encode(c, prompt + "cat"), atol=1e-6)


def test_voyages_own_bodies_are_still_voyages(c):
    r = c.post("/v1/embeddings", json={"input": ["cat"], "input_type": "query"})
    assert r.status_code == 200 and set(r.json()["usage"]) == {"total_tokens"}  # Voyage's usage
    typed = c.post("/v1/embeddings", json={"input": ["cat"], "output_dtype": "int8"})
    assert typed.status_code == 200 and all(isinstance(x, int) for x in typed.json()["data"][0]["embedding"])


def test_nvidias_truncate_cuts_at_either_end_or_refuses(c):
    words = "cat " * 20 + "zebra"  # past the fake's 16 tokens
    end = c.post("/v1/embeddings", json={"input": words, "encoding_format": "float"}).json()
    start = c.post(
        "/v1/embeddings", json={"input": words, "encoding_format": "float", "truncate": "START"}
    ).json()
    assert not np.allclose(end["data"][0]["embedding"], start["data"][0]["embedding"])
    r = c.post("/v1/embeddings", json={"input": words, "encoding_format": "float", "truncate": "NONE"})
    assert r.status_code == 413 and "truncate" in r.json()["error"]["message"]
