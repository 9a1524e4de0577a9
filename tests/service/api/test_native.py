"""The HTTP API on the tiny bundle: embeddings endpoints, tokenize, info, headers, metrics."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from export import verify
from service.http.app import onnx_loader
from tests.service.conftest import client_for


def direct(bundle, texts):
    """The serving graph called directly: the ground truth for what the API returns."""
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    ids, mask = verify.tokenize(tok, texts)
    s = ort.InferenceSession(str(bundle / "encoder.onnx"), providers=["CPUExecutionProvider"])
    return s.run(None, {"input_ids": ids, "attention_mask": mask})[0], mask.sum(1)


def test_encode_returns_normalised_vectors_equal_to_the_graph(client, tiny_bundle):
    texts = ["hello world", "a much longer sentence about nothing in particular", ""]
    r = client.post("/encode", json={"inputs": texts})
    assert r.status_code == 200
    body = r.json()
    got = np.array(body["embeddings"])
    want, lengths = direct(tiny_bundle, texts)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert body["tokens"] == lengths.tolist()
    assert body["dimensions"] == 32 and body["model"] == "tiny-random"


def test_encode_single_string_and_raw_vectors(client, tiny_bundle):
    r = client.post("/encode", json={"inputs": "just one", "normalize": False})
    got = np.array(r.json()["embeddings"])
    assert got.shape == (1, 32)
    np.testing.assert_allclose(got, direct(tiny_bundle, ["just one"])[0], atol=1e-5)


def test_dimensions_keep_a_prefix_and_renormalise(client):
    full = np.array(
        client.post("/encode", json={"inputs": "matryoshka", "normalize": False}).json()[
            "embeddings"
        ][0]
    )
    r = client.post("/encode", json={"inputs": "matryoshka", "dimensions": 8})
    v = np.array(r.json()["embeddings"][0])
    assert r.json()["dimensions"] == 8
    np.testing.assert_allclose(v, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)


def test_truncate_false_names_the_limit(client):
    r = client.post("/encode", json={"inputs": ["ok", "word " * 200], "truncate": False})
    assert r.status_code == 413
    msg = r.json()["error"]["message"]
    assert "input 1" in msg and "48" in msg and "truncate" in msg


def test_truncation_by_default_is_counted(client):
    r = client.post("/encode", json={"inputs": "word " * 200})
    assert r.status_code == 200 and r.json()["tokens"] == [48]
    metrics = client.get("/metrics").text
    assert 'headwise_truncated_inputs_total{model="tiny-random",path="encode"}' in metrics


def test_openai_float_and_base64_agree(client):
    f = client.post("/v1/embeddings", json={"input": ["one", "two"], "model": "m"}).json()
    b = client.post(
        "/v1/embeddings", json={"input": ["one", "two"], "encoding_format": "base64"}
    ).json()
    assert f["object"] == "list" and f["model"] == "m"
    assert [d["index"] for d in f["data"]] == [0, 1]
    assert f["usage"]["prompt_tokens"] == f["usage"]["total_tokens"] == 6
    for fd, bd in zip(f["data"], b["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(bd["embedding"]), dtype="<f4")
        np.testing.assert_allclose(decoded, fd["embedding"], atol=1e-7)
        assert abs(np.linalg.norm(decoded) - 1) < 1e-5


def test_openai_dimensions(client):
    r = client.post("/v1/embeddings", json={"input": "x", "dimensions": 4})
    assert len(r.json()["data"][0]["embedding"]) == 4


def test_tokenize_gives_tokens_ids_and_character_offsets(client):
    text = "Café 😍 naïve"
    r = client.post("/tokenize/details", json={"inputs": text})
    res = r.json()["results"][0]
    assert res["tokens"][0] == "[CLS]" and res["tokens"][-1] == "[SEP]"
    assert len(res["ids"]) == len(res["offsets"]) == len(res["tokens"])
    spans = [
        text[s:e]
        for (s, e), special in zip(res["offsets"], res["special"], strict=True)
        if not special
    ]
    assert spans[0] == "Café" and "😍" in spans


def test_info_describes_model_runtime_and_limits(client):
    info = client.get("/info").json()
    assert info["dimensions"] == 32 and info["num_layers"] == 2 and info["num_heads"] == 4
    assert info["max_length"] == 48
    assert info["providers"][-1] == "CPUExecutionProvider" and info["device"] == "cpu"
    assert info["fused_ops"]["Attention"] == 2
    assert info["limits"]["max_inputs"] > 0
    cores = info["cpu"]["cores"]  # the threads its runtimes run, and why that many
    assert 1 <= cores["usable"] <= cores["machine"] and cores["why"]


def test_health_ready_and_openai_model_list(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-random"


def test_request_id_is_echoed_or_made_and_timings_are_sent(client):
    r = client.post("/encode", json={"inputs": "x"}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    for h in ("x-queue-time", "x-inference-time", "x-tokenization-time", "x-total-time"):
        assert float(r.headers[h]) >= 0
    r = client.get("/health", headers={"x-request-id": "bad id with spaces"})
    assert len(r.headers["x-request-id"]) == 32


def test_metrics_families(client):
    client.post("/encode", json={"inputs": ["a", "bb"]})
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    for name in (
        "headwise_requests",
        "headwise_request_duration_seconds",
        "headwise_queue_duration_seconds",
        "headwise_inference_duration_seconds",
        "headwise_batch_size",
        "headwise_batch_tokens",
        "headwise_queue_depth",
        "headwise_tokens",
        "headwise_truncated_inputs",
        "headwise_padding_ratio",
        "headwise_model_info",
        "headwise_tokenization_duration_seconds",
    ):
        assert name in families, name
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in families["headwise_requests"].samples
    }
    key = (("endpoint", "/encode"), ("model", "tiny-random"), ("status", "200"))
    assert samples[("headwise_requests_total", key)] >= 1


def test_not_ready_answers_503(tiny_bundle):
    import threading

    gate = threading.Event()

    def slow_backend(spec, settings):
        backend = onnx_loader(spec, settings)
        backend.warmup = lambda: gate.wait(10)
        return backend

    with client_for(tiny_bundle, loader=slow_backend, wait_ready=False) as c:
        r = c.get("/ready")
        assert r.status_code == 503 and r.headers["retry-after"]
        assert c.post("/encode", json={"inputs": "x"}).status_code == 503
        gate.set()
        c.portal.call(c.app.state.registry.wait_ready)
        assert c.get("/ready").status_code == 200
        assert c.post("/encode", json={"inputs": "x"}).status_code == 200


def test_service_never_imports_torch(tiny_bundle):
    code = (
        "import sys; from service.http.app import create_app; from service.settings import Settings;"
        "from fastapi.testclient import TestClient;"
        f"app = create_app(Settings(bundle={str(tiny_bundle)!r}));"
        "c = TestClient(app).__enter__();"
        "c.portal.call(app.state.registry.wait_ready);"
        "assert c.post('/encode', json={'inputs': 'x'}).status_code == 200;"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'models', 'export'))];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_failing_backend_answers_500_without_internals_and_recovers(tiny_bundle):
    calls = {"n": 0}

    def flaky(spec, settings):
        backend = onnx_loader(spec, settings)
        real = backend.run

        def run(batch):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("/secret/path exploded")
            return real(batch)

        backend.run = run
        return backend

    with client_for(tiny_bundle, loader=flaky, warmup=False) as c:
        r = c.post("/encode", json={"inputs": "x"})
        assert r.status_code == 500
        assert "secret" not in r.text and r.json()["error"]["type"] == "inference_error"
        assert c.post("/encode", json={"inputs": "x"}).status_code == 200


@pytest.mark.parametrize("path", ["/encode", "/v1/embeddings", "/tokenize", "/attention", "/info"])
def test_api_key_guards_everything_but_health_ready_metrics(tiny_bundle, path):
    with client_for(tiny_bundle, api_key="s3cret") as c:
        method = c.get if path == "/info" else c.post
        body = {"input": "x"} if path in ("/v1/embeddings", "/attention") else {"inputs": "x"}
        kwargs = {} if path == "/info" else {"json": body}
        r = method(path, **kwargs)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert method(path, headers={"authorization": "Bearer nope"}, **kwargs).status_code == 401
        assert method(path, headers={"authorization": "Bearer s3cret"}, **kwargs).status_code == 200
        for open_path in ("/health", "/ready", "/metrics"):
            assert c.get(open_path).status_code == 200


def test_cors_is_closed_unless_configured(tiny_bundle, client):
    pre = {"origin": "https://evil.example", "access-control-request-method": "POST"}
    r = client.options("/encode", headers=pre)
    assert "access-control-allow-origin" not in r.headers
    with client_for(tiny_bundle, cors_origins=["https://ok.example"]) as c:
        r = c.options("/encode", headers={**pre, "origin": "https://ok.example"})
        assert r.headers["access-control-allow-origin"] == "https://ok.example"
        # the POST itself is answered by the hot lane, inside the CORS middleware
        r = c.post("/encode", json={"inputs": "hi"}, headers={"origin": "https://ok.example"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://ok.example"


def test_body_over_the_limit_is_413(tiny_bundle):
    with client_for(tiny_bundle, max_body_bytes=2048) as c:
        r = c.post(
            "/encode",
            content=json.dumps({"inputs": "x" * 5000}),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and "2048" in r.json()["error"]["message"]


def test_embed_all_gives_the_token_vectors_the_embedding_is_pooled_from(client):
    text = "token vectors, then mean pooling"
    tokens = np.array(client.post("/embed_all", json={"inputs": text}).json()[0])
    pooled = np.array(
        client.post("/encode", json={"inputs": text, "normalize": False}).json()["embeddings"][0]
    )
    assert tokens.shape[1] == 32
    np.testing.assert_allclose(tokens.mean(0), pooled, atol=1e-5)


def test_info_states_the_memory_bound_and_metrics_carry_rss_and_its_peak(client):
    info = client.get("/info").json()
    mem = info["memory"]
    assert mem["config"] == "shrink"
    parts = ("warm_bytes", "encode_batches_bytes", "attention_bytes", "requests_bytes")
    assert mem["bound_bytes"] == sum(mem[k] for k in parts) and mem["warm_bytes"] > 0
    text = client.get("/metrics").text
    for family in (
        "process_resident_memory_bytes",
        "headwise_process_resident_memory_peak_bytes",
        "headwise_memory_bound_bytes",
    ):
        assert f"\n{family} " in text
