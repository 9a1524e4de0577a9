"""Bad input, tried as an attacker would: every endpoint answers 4xx naming the problem, never
5xx, never hangs, and the server stays healthy. Plus property-based and schemathesis runs."""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.live import serve

JSON = {"content-type": "application/json"}
DEEP = b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}"

BAD_REQUESTS = [
    # (path, raw body, headers, expected status, words the message must contain)
    ("/encode", b"{bad json", JSON, 400, "not valid JSON"),
    ("/encode", b'{"inputs": "trunc', JSON, 400, "not valid JSON"),
    ("/encode", b"", JSON, 422, "request body is empty"),
    ("/encode", b"[1, 2]", JSON, 422, "JSON object"),
    ("/encode", b'"just a string"', JSON, 422, "JSON object"),
    ("/encode", b"null", JSON, 422, "JSON object"),
    ("/encode", DEEP, JSON, 400, "JSON"),
    ("/encode", b'{"inputs": "x"}', {"content-type": "text/plain"}, 415, "Content-Type"),
    (
        "/encode",
        b'{"inputs": "x"}',
        {"content-type": "application/x-www-form-urlencoded"},
        415,
        "Content-Type",
    ),
    ("/encode", b"{}", JSON, 422, "give inputs (texts), images, or both"),
    ("/encode", b'{"inputs": null}', JSON, 422, "inputs"),
    ("/encode", b'{"inputs": []}', JSON, 422, "must not be an empty list"),
    ("/encode", b'{"inputs": 42}', JSON, 422, "string or a list of strings"),
    ("/encode", b'{"inputs": {"a": 1}}', JSON, 422, "string or a list of strings"),
    ("/encode", b'{"inputs": [101, 2023, 102]}', JSON, 422, "token-id arrays are not accepted"),
    ("/encode", b'{"inputs": [[101, 2023]]}', JSON, 422, "token-id arrays are not accepted"),
    ("/encode", b'{"inputs": ["ok", null]}', JSON, 422, "item 1"),
    ("/encode", b'{"inputs": ["ok", ["nested"]]}', JSON, 422, "item 1"),
    ("/encode", b'{"inputs": [true]}', JSON, 422, "item 0"),
    ("/encode", b'{"inputs": "x", "normalize": "yes"}', JSON, 422, "normalize"),
    ("/encode", b'{"inputs": "x", "truncate": 1}', JSON, 422, "truncate"),
    ("/encode", b'{"inputs": "x", "dimensions": 0}', JSON, 422, "dimensions"),
    ("/encode", b'{"inputs": "x", "dimensions": 100000}', JSON, 422, "between 1 and 32"),
    ("/encode", b'{"inputs": "x", "dimensions": 3.5}', JSON, 422, "dimensions"),
    ("/encode", b'{"inputs": "x", "surprise": 1}', JSON, 422, "surprise: unknown field"),
    ("/encode", b'{"inputs": "\\ud800"}', JSON, 422, "invalid Unicode"),
    ("/encode", b'{"inputs": ["ok", "\\udc00x"]}', JSON, 422, "item 1"),
    ("/encode", b'{"inputs": "\\uZZZZ"}', JSON, 400, "JSON"),
    ("/encode", b'{"inputs": "a\xff\xfeb"}', JSON, 422, "inputs: the text is invalid Unicode"),
    ("/encode", json.dumps({"inputs": ["x"] * 5000}).encode(), JSON, 422, "limit is 2048"),
    ("/encode", json.dumps({"inputs": "x" * 200_000}).encode(), JSON, 413, "limit is 100000"),
    ("/encode", b'{"inputs": "' + b"x" * (5 << 20) + b'"}', JSON, 413, "larger than the limit"),
    ("/v1/embeddings", b'{"input": "x", "encoding_format": "hex"}', JSON, 422, "encoding_format"),
    ("/v1/embeddings", b'{"input": [1, 200000]}', JSON, 422, "outside cl100k_base"),
    ("/v1/embeddings", b'{"input": [[1], "x"]}', JSON, 422, "item 0"),
    ("/v1/embeddings", b'{"input": []}', JSON, 422, "must not be an empty list"),
    ("/v1/embeddings", b'{"model": "m"}', JSON, 422, "input: field required"),
    ("/v1/embeddings", b'{"input": "x", "dimensions": -3}', JSON, 422, "dimensions"),
    ("/tokenize/details", b'{"inputs": 7}', JSON, 422, "inputs"),
    ("/tokenize/details", b'{"inputs": "x", "add_special_tokens": "no"}', JSON, 422, "add_special_tokens"),
    ("/attention", b'{"input": ["a", "b"]}', JSON, 422, "input"),
    ("/attention", b'{"input": "x", "layers": [0, "1"]}', JSON, 422, "layers"),
    ("/attention", b'{"input": "x", "heads": [99]}', JSON, 422, "0..3"),
    ("/attention", b'{"input": "x", "format": "gif"}', JSON, 422, "format"),
    ("/attention", b'{"input": "x", "layers": 0}', JSON, 422, "layers"),
    ("/explain", b'{"input": "x", "pair": ["a", "b"]}', JSON, 422, "exactly one of"),
    ("/explain", b'{"pair": ["a", 1]}', JSON, 422, "pair"),
    ("/explain", b'{"input": "x", "target": 3}', JSON, 422, "target"),
    ("/explain", b'{"input": "x", "granularity": "char"}', JSON, 422, "granularity"),
    ("/explain", b'{"pair": ["a", "b"]}', JSON, 400, "`similarity`"),
]


@pytest.mark.parametrize(
    "path,body,headers,status,needle", BAD_REQUESTS, ids=range(len(BAD_REQUESTS))
)
def test_bad_input_gets_a_4xx_that_names_the_problem(client, path, body, headers, status, needle):
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == status, r.text[:300]
    message = r.json()["error"]["message"]
    assert needle in message, message


@pytest.mark.parametrize(
    "method,path,status",
    [
        ("GET", "/encode", 405),
        ("PUT", "/v1/embeddings", 405),
        ("GET", "/nope", 404),
        ("DELETE", "/info", 405),
    ],
)
def test_wrong_methods_and_paths(client, method, path, status):
    r = client.request(method, path)
    assert r.status_code == status and r.json()["error"]["message"]


def test_nul_bytes_and_control_characters_are_just_text(client):
    r = client.post(
        "/encode", json={"inputs": ["\x00\x01\x02", "tab\tnew\nline\r", "\u202e\u200b\ufeff"]}
    )
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 3


def test_server_is_healthy_after_the_bad_inputs(client):
    assert client.get("/health").status_code == 200
    assert client.post("/encode", json={"inputs": "still fine"}).status_code == 200


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.text(max_size=400))
def test_any_unicode_text_encodes(client, text):
    r = client.post("/encode", json={"inputs": [text]})
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["embeddings"][0]) == 32


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(
        ["/encode", "/v1/embeddings", "/tokenize/details", "/attention", "/explain"]
    ),
    body=st.one_of(
        json_values,
        st.dictionaries(
            st.sampled_from(
                [
                    "inputs",
                    "input",
                    "normalize",
                    "dimensions",
                    "layers",
                    "heads",
                    "truncate",
                    "encoding_format",
                    "pair",
                    "similarity",
                    "granularity",
                    "target",
                ]
            ),
            json_values,
            max_size=4,
        ),
    ),
)
def test_arbitrary_json_never_yields_a_server_error(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code < 500, (path, body, r.text[:300])
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


@pytest.fixture(scope="module")
def live_tiny(tiny_bundle, ranker_bundle, m3_bundle, tmp_path_factory):
    """An embedder, a reranker and a model with sparse and multi-vector outputs, so that the
    operations of every task and output answer 200 too."""
    specs = [str(tiny_bundle), f"ranker={ranker_bundle}", f"m3={m3_bundle}"]
    with serve(specs, tmp_path_factory.mktemp("schemathesis")) as server:
        yield server


def fuzz_operation(strategy, name: str, url: str, tried: dict, failures: list) -> None:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]

    @settings(
        max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
        derandomize=True,
    )
    @given(case=strategy)
    def fuzz(case):
        tried[name] = tried.get(name, 0) + 1
        try:
            case.call_and_validate(base_url=url, timeout=30, checks=checks)
        except AssertionError as exc:  # schemathesis' failures are AssertionErrors
            failures.append(f"{name} {case.body!r}: {str(exc)[:300]}")

    fuzz()


def test_schemathesis_finds_no_server_error_and_every_answer_is_as_documented(live_tiny):
    """Every operation of our own OpenAPI schema, fuzzed: zero 5xx, and every response's status
    code, content type and body conform to what the document says for that operation."""
    schema = schemathesis.openapi.from_url(f"{live_tiny.url}/openapi.json")
    tried: dict[str, int] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        name = f"{operation.method.upper()} {operation.path}"
        fuzz_operation(operation.as_strategy(), name, live_tiny.url, tried, failures)
    assert sum(tried.values()) >= 200, tried
    assert not failures, "\n".join(failures[:20])
    print(
        f"schemathesis: {sum(tried.values())} cases over {len(tried)} operations, all conforming"
    )


def test_chunked_body_over_the_limit_is_413(tiny_bundle):
    from tests.service.conftest import client_for

    def chunks():
        for _ in range(10):
            yield b"x" * 1024

    with client_for(tiny_bundle, max_body_bytes=4096) as c:
        r = c.post("/encode", content=chunks(), headers=JSON)
        assert r.status_code == 413 and "4096" in r.json()["error"]["message"]


def test_a_slow_body_times_out_408(tiny_bundle, tmp_path):
    """A client trickling its body is cut off (408). (Connections: test_protocol.py.)"""
    import socket


    env = {"HEADWISE_BODY_TIMEOUT_S": "0.5"}
    with serve(tiny_bundle, tmp_path, env=env) as server:
        port = int(server.url.rsplit(":", 1)[1])
        head = b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(head + b'{"inputs": ')  # and then nothing more
            slow.settimeout(5)
            answer = b""
            while b"did not arrive" not in answer:  # headers and body may come apart
                chunk = slow.recv(4096)
                assert chunk, f"connection closed before the whole answer: {answer!r}"
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
