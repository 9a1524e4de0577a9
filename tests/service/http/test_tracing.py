"""OpenTelemetry traces (service/http/tracing.py), against a real OTLP/HTTP receiver that decodes
what it is sent with the protocol's own protobufs (opentelemetry-proto): a request that carries
the caller's traceparent is a server span in the caller's trace, under the caller's span, with its
stages (tokenize, queue, inference with the batch's size) beneath it; without the endpoint set,
nothing is sent."""

from __future__ import annotations

import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.live import serve


class Receiver:
    """An OTLP/HTTP trace receiver on a loopback port: every span it was sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.resources: list = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                assert self.path == "/v1/traces"
                assert self.headers["content-type"] == "application/x-protobuf"
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    receiver.resources.append(rs.resource)
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, name: str, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s.name == name]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no span {name!r}; got {[s.name for s in self.spans]}")


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def traced(tiny_bundle, receiver, tmp_path_factory):
    env = {"HEADWISE_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with serve(tiny_bundle, tmp_path_factory.mktemp("traced"), env=env) as server:
        yield server


def attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = v.string_value or v.int_value or v.double_value or v.bool_value
    return out


def test_a_request_is_a_span_in_the_callers_trace_with_its_stages_beneath(traced, receiver):
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(
        f"{traced.url}/encode",
        json={"inputs": ["the cat sat", "a dog"]},
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01", "x-request-id": "traced-1"},
    )
    assert r.status_code == 200
    (span,) = [s for s in receiver.wait_for("POST /encode") if s.trace_id.hex() == trace_id]
    assert span.parent_span_id.hex() == parent_id and span.kind == span.SPAN_KIND_SERVER
    a = attributes(span)
    assert a["http.response.status_code"] == 200 and a["http.route"] == "/encode"
    assert a["headwise.request_id"] == "traced-1" and a["headwise.tokens"] == sum(r.json()["tokens"])
    stages = {}
    for name in ("tokenize", "queue", "inference"):
        (child,) = [s for s in receiver.wait_for(name) if s.trace_id.hex() == trace_id]
        assert child.parent_span_id == span.span_id
        assert span.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= span.end_time_unix_nano
        stages[name] = child
    assert stages["tokenize"].end_time_unix_nano == stages["queue"].start_time_unix_nano
    inference = attributes(stages["inference"])
    assert inference["headwise.batch_size"] >= 2 and inference["headwise.batch_tokens"] >= 4
    names = {kv.value.string_value for res in receiver.resources for kv in res.attributes if kv.key == "service.name"}
    assert names == {"headwise"}


def test_without_a_caller_a_request_starts_its_own_trace(traced, receiver):
    before = {s.trace_id for s in receiver.spans}
    assert httpx.get(f"{traced.url}/v2/models/{'tiny'}/ready").status_code in (200, 404)
    assert httpx.post(f"{traced.url}/v1/embeddings", json={"input": "x"}).status_code == 200
    spans = [s for s in receiver.wait_for("POST /v1/embeddings") if s.trace_id not in before]
    assert spans and all(not s.parent_span_id for s in spans)


def test_without_the_endpoint_nothing_is_sent(tiny_bundle, receiver, tmp_path):
    count = len(receiver.spans)
    with serve(tiny_bundle, tmp_path, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}) as server:
        assert httpx.post(f"{server.url}/encode", json={"inputs": "x"}).status_code == 200
    time.sleep(0.5)
    assert len(receiver.spans) == count


def test_a_grpc_call_is_a_span_in_the_callers_trace_too(tiny_bundle, receiver, tmp_path):
    """traceparent as gRPC metadata: the call's span (named by its method, as OpenTelemetry's
    RPC conventions do) is in the caller's trace, with its stages beneath."""
    import grpc

    from bench.server import free_port
    from service.rpc.generated import tei_pb2 as tei
    from service.rpc.generated import tei_pb2_grpc as tei_grpc

    port = free_port()
    env = {"HEADWISE_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50", "HEADWISE_GRPC_PORT": str(port)}
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with serve(tiny_bundle, tmp_path, env=env), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"),)
        tei_grpc.EmbedStub(channel).Embed(tei.EmbedRequest(inputs="the cat sat"), metadata=metadata)
        (span,) = [s for s in receiver.wait_for("tei.v1.Embed/Embed") if s.trace_id.hex() == trace_id]
        assert span.parent_span_id.hex() == parent_id and span.kind == span.SPAN_KIND_SERVER
        a = attributes(span)
        assert a["rpc.system"] == "grpc" and a["rpc.method"] == "Embed" and a["headwise.tokens"] > 0
        (inference,) = [s for s in receiver.wait_for("inference") if s.trace_id.hex() == trace_id]
        assert inference.parent_span_id == span.span_id
