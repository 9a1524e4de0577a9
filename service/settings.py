"""All service settings in one object, read from HEADWISE_* variables when the app is created."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEADWISE_", extra="ignore")

    bundle: Path = Field(
        Path("bundles/default"), description="bundle folder to serve, when BUNDLES is empty"
    )
    bundles: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="several bundles: comma-separated DIR or NAME=DIR (first answers by default)",
    )
    host: str = Field("127.0.0.1", description="bind address (`0.0.0.0` in the images), for HTTP and gRPC")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="gRPC on this port too (Triton's is 8001), in the same process and batchers: "
        "the Open Inference Protocol's GRPCInferenceService and TEI's tei.v1 services, health "
        "and reflection; unset: HTTP only (0: any free port, for tests)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="debug, info, warning, error"
    )
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object a line")
    access_log: bool = Field(False, description="log one line per request (method, path, status, ms)")
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry: send a trace span per request (tokenize, queue, inference "
        "under it; the caller's traceparent honoured) to this OTLP/HTTP collector, e.g. "
        "http://collector:4318; unset: no tracing",
    )

    # Runtime
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: CUDA when available, else CPU with a warning; cuda: refuse without it",
    )
    runtime: Literal["auto", "onnxruntime", "openvino"] = Field(
        "auto",
        description="what runs the serving graph on a CPU: auto: OpenVINO in bf16 where the CPU "
        "has bf16 units (amx_bf16, avx512_bf16), ONNX Runtime elsewhere; /info says which, why",
    )
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] = Field(
        "auto",
        description="auto: fp16 graph on CUDA when the bundle has one, bf16 with OpenVINO on a "
        "CPU with bf16 units, else fp32; bf16: OpenVINO on such a CPU only (refused elsewhere)",
    )
    precision_gate_pairs: int = Field(
        500,
        ge=50,
        description="query -> document pairs (CPython's docstrings) on which a precision other "
        "than fp32 on OpenVINO is judged at start against fp32: recall@10 and MRR within 0.5 point",
    )
    threads: int = Field(
        0,
        ge=0,
        description="ONNX Runtime intra-op threads; 0 = one per core, or where the process may "
        "use fewer CPUs than the machine has (taskset, a cpuset, a container's CPU quota such as "
        "Kubernetes' limits.cpu), one per CPU it may use (ONNX Runtime and OpenVINO alike; "
        "GET /info: cpu.cores)",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="server processes on the one port (SO_REUSEPORT: the kernel spreads the "
        "connections), each with its own copy of the models, its own slice of the CPUs and a "
        "share of the memory limit and connection limits; /metrics adds them up. One process's "
        "event loop is what caps one-text requests on a many-core machine (bench/workers.py)",
    )
    openvino_padding: bool = Field(
        True,
        description="OpenVINO in bf16: pad a batch up to the next multiple of the CPU's tile (16 "
        "tokens) where start-up measured that length faster than the batch's own (AMX: 1.1x the "
        "texts/s at 32 clients; engine/tiles.py, bench/tiles.py); false: every batch at its own",
    )
    openvino_streams: int = Field(
        0,
        ge=0,
        le=64,
        description="batches OpenVINO computes at once, each on its share of the cores: more "
        "texts/s under load, a lone text slower (bench/streams.py); 1: one batch with every core; "
        "0: chosen by the CPUs the process may use and the memory limit (2 from 16 CPUs, and from 2 "
        "on AMX, when the limit has room for them; else 1: measured on 2 and 16)",
    )
    spinning: bool = Field(True, description="let ORT threads spin between runs (one session only)")
    inline_max_tokens: int = Field(
        64,
        ge=0,
        description="a batch of at most this many tokens (padded) runs on the event loop when "
        "nothing else is queued or arriving: one short text skips two thread hops (~0.3 ms); "
        "CPU only; 0 = always on the inference thread",
    )
    warmup: bool = Field(
        True,
        description="run the graphs once and time each serving session (CALIBRATION_S) before "
        "ready; false: neither, admission learns costs from the batches served",
    )
    memory: Literal["shrink", "off", "arena"] = Field(
        "shrink",
        description="ONNX Runtime CPU memory: shrink: arena handed back after every run; off: "
        "plain malloc; arena: keeps the largest batch ever seen (fastest, never shrinks)",
    )
    verify_bundle: bool = Field(True, description="check every file's sha256 against the manifest")
    memory_limit_bytes: int | None = Field(
        None,
        ge=0,
        description="memory the server may use: the start fails, naming the model that does not "
        "fit, when the bound (GET /info: memory) passes it; unset: the container's cgroup limit "
        "when readable; 0: not checked",
    )

    # Batching
    max_batch_tokens: int = Field(
        16384, ge=1, description="padded tokens (longest x count) per batch"
    )
    max_batch_s: float = Field(
        1.0,
        ge=0,
        description="a batch holds at most this many seconds of work at the measured throughput, "
        "so no answer waits long past its deadline behind the batch running (0: no bound)",
    )
    max_batch_size: int = Field(64, ge=1, description="texts per batch")
    long_tokens: int = Field(
        1024,
        ge=0,
        description="sequences longer than this run in the long lane: their own ONNX Runtime "
        "session (one thread, lowest CPU priority), so a long input cannot hold short ones back; "
        "only for models whose inputs can be longer; 0 = off",
    )
    max_wait_ms: float = Field(2.0, ge=0, description="how long a batch may wait to fill up")
    max_padding_ratio: float = Field(
        0.1, ge=0, le=1, description="stop growing a batch when padding would exceed this share"
    )
    padding_slack_tokens: int = Field(
        8,
        ge=0,
        description="padding tokens a batch may add past max_padding_ratio (cheaper than a run)",
    )
    max_queue_texts: int = Field(4096, ge=1, description="texts waiting; more is answered 429")
    request_timeout_s: float = Field(30.0, gt=0, description="a request's deadline; then 503")
    capacity_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="unset: admission prices each batch by its cost measured on this machine "
        "(warm-up times every serving session, served batches refine it; GET /info: capacity); "
        "set: a stated rate of padded tokens a second instead, for every model and session",
    )
    calibration_s: float = Field(
        8.0,
        ge=0,
        description="seconds warm-up may spend timing each serving session (a model's main "
        "lane, its long lane, its attention graph) before ready; lengths that would take longer "
        "are predicted from the shorter ones",
    )

    admission_headroom: float = Field(
        0.8,
        gt=0,
        le=1,
        description="the share of a request's deadline admission plans to fill at the measured "
        "rate; the rest absorbs what the rate does not see (parsing and tokenising the requests "
        "around it, models contending for the cores)",
    )

    openai_token_ids: bool = Field(
        True,
        description="accept cl100k_base token-id arrays on /v1/embeddings (LangChain's default)",
    )

    # Sparse and multi-vector outputs (bge-m3, SPLADE, ColBERT)
    multi_vector_max_numbers: int = Field(
        4_000_000,
        ge=1,
        description="token vectors x their width one /encode answer may hold (about 12 bytes a "
        "number in JSON, 5.3 in base64); then 413",
    )
    multi_vector_budget_numbers: int = Field(
        16_000_000,
        ge=1,
        description="token vectors x width of all a model's answers in flight together; then 429",
    )
    sparse_batch_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1 << 20,
        description="a SPLADE graph's vocabulary-wide logits (tokens x vocabulary x 8 bytes) per "
        "batch: its batches hold at most this many bytes' worth of tokens (always one input)",
    )

    # Request bounds
    max_inputs: int = Field(2048, ge=1, description="inputs per request (split across batches)")
    max_input_chars: int = Field(100_000, ge=1, description="characters per input")
    rerank_max_documents: int = Field(
        1024, ge=1, description="documents per rerank request (split across batches); then 413"
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="request body size; then 413")

    # Images (CLIP, SigLIP): what one image may cost, and where one may come from
    max_images: int = Field(64, ge=1, description="images per request; then 422")
    image_max_bytes: int = Field(
        20 * 2**20, ge=1024, description="an image's encoded bytes (base64 decoded, or fetched)"
    )
    image_max_pixels: int = Field(
        50_000_000,
        ge=1,
        le=89_478_485,  # PIL's own bomb threshold, where it warns and then refuses
        description="an image's width x height, read from its header before decoding; then 413",
    )
    image_url_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="hosts whose http(s) image URLs the server may fetch, comma-separated "
        "(empty: none; no request leaves the server unless an operator lists hosts)",
    )
    image_fetch_timeout_s: float = Field(10.0, gt=0, description="an image URL's whole fetch")
    image_decode_threads: int = Field(
        2, ge=1, description="images decoded at once (each holds its decoded pixels)"
    )

    body_timeout_s: float = Field(
        10.0, gt=0, description="a request body sent in pieces must arrive within this; then 408"
    )
    keep_alive_s: float = Field(
        30.0, gt=0, description="idle keep-alive connections are closed after this (uvicorn: 5)"
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request's headers must arrive within this of the connection opening (or of "
        "its first byte, on a kept-alive one); then the connection is closed (408 if any came)",
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="request header bytes; then 431 and the connection closed"
    )
    max_concurrency: int = Field(
        1024,
        ge=1,
        description="requests in flight at once (idle connections do not count); more are "
        "answered 503 with Retry-After, but liveness",
    )
    max_connections: int = Field(
        2048,
        ge=16,
        description="open connections; a new one past it closes the longest-idle one, or, when "
        "every one is busy, is answered 503 with Retry-After (liveness still answered)",
    )

    # Attention maps
    attention_enabled: bool = Field(True, description="serve /attention; false answers 404")
    attention_max_tokens: int = Field(256, ge=2, description="tokens per /attention input")
    attention_max_numbers: int = Field(
        5_000_000, ge=1, description="layers x heads x tokens² returned by one /attention call"
    )
    attention_queue: int = Field(8, ge=1, description="/attention requests waiting; then 429")
    attention_budget_numbers: int = Field(
        10_000_000,
        ge=1,
        description="layers x heads x tokens² of all /attention calls in flight together; then 429",
    )
    attention_threads: int = Field(
        1, ge=0, description="intra-op threads of the attention graph (0 = one per core)"
    )
    attention_cpu_share: float = Field(
        0.15,
        gt=0,
        le=1,
        description="most of the CPU /attention may take: after a call, the next waits",
    )

    # Explanations (occlusion)
    explain_max_work: int = Field(
        131_072,
        ge=1,
        description="tokens x forward passes of one /explain request (the text, then the text "
        "with each part left out); then 413",
    )
    explain_cpu_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="most of the time /explain may compute while other requests queue work: "
        "after a piece of t s the next waits t x (1/share - 1); no pause while nobody else does",
    )
    explain_batch_tokens: int = Field(
        2048,
        ge=1,
        description="tokens of one explanation's variants queued at once (one batch, no "
        "padding): the longest other requests wait behind an explanation",
    )
    explain_queue: int = Field(
        4, ge=1, description="/explain requests in flight at once; more are answered 429"
    )

    # Security
    api_key: SecretStr | None = Field(
        None, description="Bearer key for all but health/ready/metrics"
    )
    cors_origins: list[str] = Field(default_factory=list, description="allowed CORS origins")

    # Shutdown
    drain_timeout_s: float = Field(
        30.0, gt=0, description="grace for in-flight requests on SIGTERM"
    )

    @field_validator("bundles", "image_url_hosts", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def bundle_specs(self) -> list[str]:
        return self.bundles or [str(self.bundle)]

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.api_key is not None and not self.api_key.get_secret_value():
            self.api_key = None
        return self
