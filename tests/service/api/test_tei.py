"""TEI's API: same paths, request fields and defaults, response shapes and status codes as
TEI's published OpenAPI document (tests/reference/tei-openapi.json, TEI 1.9.3), on fakes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from service.api.tei import schemas as tei_schemas
from service.tensors import Batch, l2_normalize
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

SPEC = json.loads((Path(__file__).parents[2] / "reference" / "tei-openapi.json").read_text())


def openapi_to_jsonschema(node):
    """OpenAPI 3.0's `nullable` and `example` -> plain JSON Schema."""
    if isinstance(node, dict):
        out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k not in ("example",)}
        if out.pop("nullable", False) and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    return node


COMPONENTS = openapi_to_jsonschema(SPEC["components"])


def check(instance, component: str) -> None:
    schema = {"$ref": f"#/components/schemas/{component}", "components": COMPONENTS}
    jsonschema.validate(instance, schema)


def response_schema(path: str, status: str) -> str:
    content = SPEC["paths"][path]["post"]["responses"][status]["content"]
    return content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def fake():
    return FakeBackend(fake_manifest("fake-embedder", prompts={"query": "the "}))


@pytest.fixture(scope="module")
def tei(fake):
    with client_for(Path("f"), loader=fake_loader(fake)) as c:
        yield c


def want(fake: FakeBackend, text: str) -> np.ndarray:
    (enc,) = fake.tokenize([text])
    return l2_normalize(fake.vectors(Batch.of([enc.ids])))[0]


@pytest.mark.parametrize(
    "path,model",
    [
        ("/embed", tei_schemas.EmbedRequest),
        ("/embed_all", tei_schemas.EmbedAllRequest),
        ("/embed_sparse", tei_schemas.EmbedSparseRequest),
        ("/similarity", tei_schemas.SimilarityRequest),
        ("/decode", tei_schemas.DecodeRequest),
        ("/tokenize", tei_schemas.TokenizeRequest),
    ],
)
def test_request_fields_and_defaults_are_teis(path, model):
    ref = SPEC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    schema = SPEC["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    assert set(schema["properties"]) <= set(model.model_fields), path
    for name, prop in schema["properties"].items():
        default = prop.get("default")
        if default is None or default == "null":
            continue
        if name == "truncate":  # TEI: null means the server's auto_truncate; ours says true
            assert model.model_fields[name].default is None
            continue
        ours = model.model_fields[name].default
        assert str(ours).lower() == str(default).lower(), (path, name, ours, default)
    assert set(schema.get("required", [])) == {
        n for n, f in model.model_fields.items() if f.is_required()
    }


def test_embed_answers_a_list_of_vectors(tei, fake):
    r = tei.post("/embed", json={"inputs": ["the cat", "a dog"]})
    assert r.status_code == 200
    check(r.json(), response_schema("/embed", "200"))
    np.testing.assert_allclose(r.json()[0], want(fake, "the cat"), atol=1e-6)
    one = tei.post("/embed", json={"inputs": "the cat", "normalize": False, "dimensions": 4}).json()
    assert len(one) == 1 and len(one[0]) == 4


def test_embed_takes_the_models_own_token_ids(tei, fake):
    (enc,) = fake.tokenize(["the cat"])
    by_ids = tei.post("/embed", json={"inputs": [enc.ids]}).json()
    np.testing.assert_allclose(by_ids[0], want(fake, "the cat"), atol=1e-6)
    r = tei.post("/embed", json={"inputs": [[1, 10**9]]})
    assert r.status_code == 422 and "vocabulary" in r.json()["error"]


def test_embed_applies_a_prompt_by_name(tei, fake):
    prompted = tei.post("/embed", json={"inputs": "cat", "prompt_name": "query"}).json()[0]
    np.testing.assert_allclose(prompted, want(fake, "the cat"), atol=1e-6)
    r = tei.post("/embed", json={"inputs": "cat", "prompt_name": "nope"})
    assert r.status_code == 422 and "query" in r.json()["error"]


def test_truncation_direction_left_keeps_the_end(tei, fake):
    words = " ".join(["one"] * 20 + ["zebra"])
    right = tei.post("/embed", json={"inputs": words}).json()[0]
    left = tei.post("/embed", json={"inputs": words, "truncation_direction": "Left"}).json()[0]
    assert not np.allclose(right, left)
    tokens = tei.post("/tokenize", json={"inputs": words}).json()[0]
    assert [t["text"] for t in tokens][-2] == "one"  # right truncation dropped the zebra


def test_truncate_false_on_a_long_input_is_413_in_teis_error_shape(tei):
    r = tei.post("/embed", json={"inputs": "one " * 40, "truncate": False})
    assert r.status_code == 413
    check(r.json(), "ErrorResponse")
    assert r.json()["error_type"] == "Validation" and "16" in r.json()["error"]


def test_validation_errors_take_teis_error_shape(tei):
    r = tei.post("/embed", json={"inputs": 7})
    assert r.status_code == 422
    check(r.json(), "ErrorResponse")


def test_unknown_fields_are_ignored_on_compatibility_routes(tei):
    assert tei.post("/embed", json={"inputs": "x", "surprise": 1}).status_code == 200
    assert tei.post("/v1/embeddings", json={"input": "x", "input_type": "query"}).status_code == 200
    assert tei.post("/encode", json={"inputs": "x", "surprise": 1}).status_code == 422


def test_root_answers_as_embed_for_an_embedding_model(tei, fake):
    r = tei.post("/", json={"inputs": "the cat"})
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()[0], want(fake, "the cat"), atol=1e-6)
    bad = tei.post("/", json={"inputs": {"x": 1}})
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"


def test_embed_all_gives_each_tokens_vector(tei, fake):
    r = tei.post("/embed_all", json={"inputs": ["the cat", "dog"]})
    assert r.status_code == 200
    check(r.json(), response_schema("/embed_all", "200"))
    got = r.json()
    assert [len(v) for v in got] == [4, 3]  # [CLS] the cat [SEP], [CLS] dog [SEP]
    (enc,) = fake.tokenize(["dog"])
    np.testing.assert_allclose(got[1], fake.run_tokens(Batch.of([enc.ids]))[0], atol=1e-6)


def test_similarity_is_the_cosine_to_the_source(tei, fake):
    body = {"inputs": {"source_sentence": "the cat", "sentences": ["the cat", "a dog"]}}
    r = tei.post("/similarity", json=body)
    check(r.json(), response_schema("/similarity", "200"))
    assert r.json()[0] == pytest.approx(1.0, abs=1e-6)
    assert r.json()[1] == pytest.approx(float(want(fake, "the cat") @ want(fake, "a dog")), abs=1e-6)


def test_decode_turns_ids_back_into_text(tei, fake):
    (enc,) = fake.tokenize(["the cat"])
    r = tei.post("/decode", json={"ids": enc.ids})
    check(r.json(), response_schema("/decode", "200"))
    assert r.json() == ["the cat"]
    assert tei.post("/decode", json={"ids": [enc.ids, enc.ids]}).json() == ["the cat"] * 2
    assert tei.post("/decode", json={"ids": [99999]}).status_code == 422


def test_tokenize_gives_teis_simple_tokens(tei):
    r = tei.post("/tokenize", json={"inputs": ["the cat"]})
    check(r.json(), response_schema("/tokenize", "200"))
    tokens = r.json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "the", "cat", "[SEP]"]
    assert [t["special"] for t in tokens] == [True, False, False, True]
    assert (tokens[2]["start"], tokens[2]["stop"]) == (4, 7)
    assert (tokens[0]["start"], tokens[0]["stop"]) == (None, None)  # TEI: no span for specials


def test_tokenize_texts_are_the_inputs_own_characters_and_spans_are_utf8_bytes(family_tokenizers):
    """As TEI's router: the text before normalisation (not the lower-cased token), and byte
    offsets, so that input.encode()[start:stop] is the token's text on non-ASCII input too."""
    from tokenizers import Tokenizer

    from service.api.tei.handlers import simple_tokens

    tok = Tokenizer.from_file(str(family_tokenizers["wordpiece"]))  # lower-cases, strips accents
    text = "Le Chat dort — café naïve 猫 sur le canapé"
    tokens = simple_tokens(text, tok.encode(text))
    raw = text.encode()
    words = [t for t in tokens if not t["special"]]
    assert words and all(raw[t["start"] : t["stop"]].decode() == t["text"] for t in words)
    assert any(t["text"] == "Chat" for t in words)  # the input's own case, not "chat"
    cat = next(t for t in words if t["text"] == "猫")
    assert cat["stop"] - cat["start"] == 3  # one character, three bytes
    assert [t["special"] for t in tokens][0] and tokens[0]["start"] is None


def test_embed_sparse_is_a_4xx_that_says_why(tei):
    r = tei.post("/embed_sparse", json={"inputs": "x"})
    assert r.status_code == 400 and "sparse" in r.json()["error"]
    assert "fake-embedder (embed: dense)" in r.json()["error"]  # the model's outputs
    check(r.json(), "ErrorResponse")


def test_embed_sparse_answers_teis_sparse_values():
    from service.manifest import SparseOutput

    backend = FakeBackend(
        fake_manifest("splade", outputs=["sparse"], sparse=SparseOutput(kind="vocabulary", graph_output="s"))
    )
    with client_for(Path("s"), loader=fake_loader(backend)) as c:
        r = c.post("/embed_sparse", json={"inputs": ["the cat", "zebra zebra"], "truncate": True})
        assert r.status_code == 200
        check(r.json(), response_schema("/embed_sparse", "200"))
        rows = r.json()
        assert [e["index"] for e in rows[1]] == sorted(e["index"] for e in rows[1])
        zebra = backend.tokenizer.token_to_id("zebra")
        assert {"index": zebra, "value": 2.0} in rows[1]
        assert c.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}


def test_info_carries_teis_fields(tei):
    info = tei.get("/info").json()
    check({k: v for k, v in info.items() if k in SPEC["components"]["schemas"]["Info"]["properties"]}, "Info")
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["auto_truncate"]
    assert info["max_input_length"] == 16 and info["model_id"] == "fake-embedder"


def test_every_4xx_is_logged_once_with_id_route_status_model_and_message(tei, caplog):
    with caplog.at_level(logging.INFO, logger="service.http.errors"):
        tei.post("/encode", json={"inputs": "x", "dimensions": 999}, headers={"x-request-id": "r-42"})
    lines = [r for r in caplog.records if getattr(r, "request_id", "") == "r-42"]
    assert len(lines) == 1
    rec = lines[0]
    assert (rec.route, rec.status, rec.model) == ("POST /encode", 422, "fake-embedder")
    assert "dimensions" in rec.getMessage()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/embed", {"inputs": []}, "inputs"),
        ("/embed_all", {"inputs": []}, "inputs"),
        ("/embed_sparse", {"inputs": []}, "inputs"),
        ("/tokenize", {"inputs": []}, "inputs"),
        ("/rerank", {"query": "q", "texts": []}, "texts"),
        ("/predict", {"inputs": []}, "inputs"),
    ],
)
def test_an_empty_batch_is_400_with_teis_empty_error_type(tei, fake, path, body, field):
    """TEI's router: `inputs` (`texts`) cannot be empty, ErrorType::Empty, which it answers 400
    (tests/reference/tei-openapi.json lists Empty among its error types); nothing is run."""
    seen = len(fake.seen)
    r = tei.post(path, json=body)
    assert r.status_code == 400, r.text
    check(r.json(), "ErrorResponse")
    assert r.json() == {"error": f"`{field}` cannot be empty", "error_type": "Empty"}
    assert len(fake.seen) == seen
    assert tei.post("/embed", json={"inputs": "x"}).status_code == 200  # still 200 otherwise
