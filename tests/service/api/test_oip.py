"""The Open Inference Protocol v2 over HTTP, driven by Triton's own client (tritonclient.http) with
its defaults (BYTES in and FP32 out as binary tensors) and with JSON tensors, against a real
server with an embedder, a reranker and a classifier: metadata names each model's tensors, infer
answers equal headwise's own routes, and errors are the protocol's ({"error": ...}), never a 500."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from service.tensors import cosines
from tests.live import serve

tritonhttp = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog barked", "hello world", "the fox is quick and brown"]
QUERY = "where did the cat sit"


@pytest.fixture(scope="module")
def classifier(family_tokenizers, tmp_path_factory):
    from tests.export.test_architectures import export, save_checkpoint

    tmp = tmp_path_factory.mktemp("nli")
    folder = save_checkpoint(
        tmp / "nli", "bert", family_tokenizers["wordpiece"], "ForSequenceClassification", num_labels=3
    )
    export(folder, tmp / "bundle")
    return tmp / "bundle"


@pytest.fixture(scope="module")
def live(tiny_bundle, ranker_bundle, classifier, tmp_path_factory):
    specs = [
        f"tiny={tiny_bundle}", f"ranker={ranker_bundle}", f"nli={classifier}", f"acme/tiny-v2={tiny_bundle}"
    ]
    with serve(specs, tmp_path_factory.mktemp("oip")) as server:
        yield server


@pytest.fixture(scope="module")
def triton(live):
    return tritonhttp.InferenceServerClient(live.url.removeprefix("http://"))


def text_input(name: str, texts: list[str], binary: bool = True):
    tensor = tritonhttp.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return tensor


def test_health_server_and_model_metadata(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny") and triton.is_model_ready("ranker", "1")
    server = triton.get_server_metadata()
    assert server["name"] == "headwise" and "binary_tensor_data" in server["extensions"]
    tiny = triton.get_model_metadata("tiny")
    assert tiny["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert tiny["outputs"][0]["name"] == "embedding" and tiny["outputs"][0]["shape"][0] == -1
    ranker = triton.get_model_metadata("ranker", "1")
    assert [i["name"] for i in ranker["inputs"]] == ["query", "document"]
    nli = triton.get_model_metadata("nli")
    assert nli["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 3]}]


@pytest.mark.parametrize("binary", [True, False])
def test_embeddings_equal_encodes(live, triton, binary):
    want = np.array(httpx.post(f"{live.url}/encode", json={"inputs": TEXTS, "model": "tiny"}).json()["embeddings"])
    outputs = None if binary else [tritonhttp.InferRequestedOutput("embedding", binary_data=False)]
    result = triton.infer("tiny", [text_input("text", TEXTS, binary)], outputs=outputs)
    got = result.as_numpy("embedding")
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosines(got, want).min() >= 0.999999
    assert result.get_response()["model_name"] == "tiny"


def test_a_name_with_slashes_is_reachable_as_hub_ids_are(live, triton):
    assert triton.is_model_ready("acme/tiny-v2") and triton.is_model_ready("acme/tiny-v2", "1")
    assert triton.get_model_metadata("acme/tiny-v2")["name"] == "acme/tiny-v2"
    got = triton.infer("acme/tiny-v2", [text_input("text", TEXTS)]).as_numpy("embedding")
    want = triton.infer("tiny", [text_input("text", TEXTS)]).as_numpy("embedding")
    np.testing.assert_allclose(got, want, atol=1e-6)
    r = httpx.get(f"{live.url}/v2/models/acme/tiny-v2/versions/2/ready")
    assert r.status_code == 404 and "version 1 only" in r.json()["error"]


def test_rerank_scores_equal_reranks(live, triton):
    docs = TEXTS
    body = {"query": QUERY, "texts": docs, "model": "ranker"}
    want = {r["index"]: r["score"] for r in httpx.post(f"{live.url}/rerank", json=body).json()}
    result = triton.infer("ranker", [text_input("query", [QUERY]), text_input("document", docs)])
    got = result.as_numpy("score")
    np.testing.assert_allclose(got, [want[i] for i in range(len(docs))], rtol=1e-5, atol=1e-6)


def test_classifier_scores_equal_predicts(live, triton):
    answer = httpx.post(f"{live.url}/predict", json={"inputs": TEXTS, "model": "nli"}).json()
    labels = [e["label"] for e in sorted(answer[0], key=lambda e: e["label"])]
    want = np.array([[e["score"] for e in sorted(row, key=lambda e: labels.index(e["label"]))] for row in answer])
    got = triton.infer("nli", [text_input("text", TEXTS)]).as_numpy("scores")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    pairs = triton.infer("nli", [text_input("text", TEXTS), text_input("text_pair", TEXTS[::-1])])
    assert pairs.as_numpy("scores").shape == (len(TEXTS), 3)


def test_json_tensors_as_the_protocol_writes_them(live):
    body = {
        "id": "42",
        "inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a cat"], ["a dog"]]}],
    }
    r = httpx.post(f"{live.url}/v2/models/tiny/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "42" and out["model_version"] == "1"
    (tensor,) = out["outputs"]
    assert tensor["name"] == "embedding" and tensor["datatype"] == "FP32"
    assert len(tensor["data"]) == tensor["shape"][0] * tensor["shape"][1] and tensor["shape"][0] == 2


@pytest.mark.parametrize(
    ("model", "inputs", "status", "says"),
    [
        ("nobody", [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}], 404, "not served"),
        ("tiny", [{"name": "text", "shape": [1], "datatype": "INT32", "data": [1]}], 400, "must be BYTES"),
        ("tiny", [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["x"]}], 400, "holds 2"),
        ("tiny", [{"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["x", "y"]}], 400, "[n] or [n, 1]"),
        ("tiny", [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["x"]}], 400, "unexpected input"),
        ("tiny", [{"name": "text", "shape": [1], "datatype": "STRING", "data": ["x"]}], 400, "unknown datatype"),
        ("ranker", [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["x"]}], 400, "'document' is missing"),
        ("tiny", [{"name": "text", "shape": [3000], "datatype": "BYTES", "data": ["x"] * 3000}], 400, "limit"),
    ],
)
def test_errors_are_the_protocols(live, model, inputs, status, says):
    r = httpx.post(f"{live.url}/v2/models/{model}/infer", json={"inputs": inputs})
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and says in r.json()["error"]


def test_tritonclient_reads_the_errors(triton):
    with pytest.raises(InferenceServerException, match="not served"):
        triton.infer("nobody", [text_input("text", ["x"])])
    bad = tritonhttp.InferInput("text", [1], "INT32")
    bad.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="must be BYTES"):
        triton.infer("tiny", [bad])
    with pytest.raises(InferenceServerException, match="unknown output"):
        triton.infer("tiny", [text_input("text", ["x"])], outputs=[tritonhttp.InferRequestedOutput("nope")])


def test_a_broken_binary_body_is_a_400(live):
    header = b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":9}}]}'
    body = header + b"\x05\x00\x00\x00abc"  # 7 bytes where 9 are announced
    r = httpx.post(
        f"{live.url}/v2/models/tiny/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "binary" in r.json()["error"]
