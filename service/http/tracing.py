"""OpenTelemetry traces, off unless HEADWISE_OTLP_ENDPOINT names a collector (OTLP over HTTP,
protobuf: http://collector:4318). The standard variables still apply to what they govern:
OTEL_SERVICE_NAME (default headwise), OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT.

A span per request (kind SERVER, named by its declared route: "POST /encode"), a child of the
caller's when the request carries W3C `traceparent` (and `tracestate`), so that a call is
followed from a gateway through headwise to whatever called it next. Its children are the
request's stages as the pipelines measured them, laid end to end from when its body arrived:
`tokenize`, `queue` (waiting for a batch) and `inference` (with the batch's size and padded
tokens). Spans are exported in batches on a thread (BatchSpanProcessor), flushed at shutdown.

Off, nothing is imported and the middleware does nothing more than before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from service import __version__
from service.pipelines.call import Timings

log = logging.getLogger(__name__)


class Tracing:
    def __init__(self, endpoint: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        name = os.environ.get("OTEL_SERVICE_NAME", "headwise")
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": name, "service.version": __version__})
        )
        url = endpoint.rstrip("/")
        if not url.endswith("/v1/traces"):
            url += "/v1/traces"
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("headwise", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self._server, self._error, self._status = SpanKind.SERVER, StatusCode.ERROR, Status
        log.info("tracing: spans to %s as %s", url, name)

    def start(self, method: str, route: str, path: str, headers: Mapping[str, str]) -> Any:
        """The request's span, started now, under the caller's trace when it sent one."""
        context = self.propagator.extract(carrier=dict(headers))
        return self.tracer.start_span(
            f"{method} {route}",
            context=context,
            kind=self._server,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "url.path": path,
            },
        )

    def start_rpc(self, method: str, metadata: Mapping[str, str]) -> Any:
        """A gRPC call's span (method: "/tei.v1.Embed/Embed"), named and described as
        OpenTelemetry's RPC conventions say, under the caller's trace (`traceparent` metadata)."""
        service, _, name = method.lstrip("/").partition("/")
        return self.tracer.start_span(
            f"{service}/{name}",
            context=self.propagator.extract(carrier=dict(metadata)),
            kind=self._server,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )

    def finish(
        self,
        span: Any,
        status: int,
        state: Mapping[str, Any],
        arrived_ns: int | None,
    ) -> None:
        """The request's answer and stages on its span, then ended (now)."""
        from opentelemetry.trace import set_span_in_context

        span.set_attribute("http.response.status_code", status)
        for key, attribute in (("request_id", "headwise.request_id"), ("model", "headwise.model")):
            if state.get(key):
                span.set_attribute(attribute, str(state[key]))
        if status >= 500:
            span.set_status(self._status(self._error))
        timings: Timings | None = state.get("timings")
        if timings is not None and arrived_ns is not None:
            span.set_attribute("headwise.tokens", timings.tokens)
            parent = set_span_in_context(span)
            at = arrived_ns
            for stage, seconds, attributes in (
                ("tokenize", timings.tokenization_s, {}),
                ("queue", timings.queue_s, {}),
                (
                    "inference",
                    timings.inference_s,
                    {
                        "headwise.batches": timings.batches,
                        "headwise.batch_size": timings.batch_size,
                        "headwise.batch_tokens": timings.batch_tokens,
                    },
                ),
            ):
                end = at + int(seconds * 1e9)
                child = self.tracer.start_span(
                    stage, context=parent, start_time=at, attributes=attributes
                )
                child.end(end_time=end)
                at = end
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is left


def wall_ns(monotonic_s: float) -> int:
    """A time.monotonic() reading as wall-clock nanoseconds (what spans carry)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)
