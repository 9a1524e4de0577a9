"""The backend interface the pipelines talk to, and its ONNX Runtime implementation.

pre:  tokenize(texts) / tokenize_pairs(pairs) -> encodings (truncated at the max length)
core: run(batch) -> (B, d) pooled embeddings or (B, labels) logits   (the fused serving graph)
      run_outputs(batch) -> every output by name (sparse, token vectors; one run)
      attend(batch) -> primary output, attentions (L, B, h, N, N)     (the unfused debug graph)
post: normalisation, dimensions, activations are per request, in the pipelines
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from service.bundle import Bundle
from service.engine.sessions import CPU, CUDA, build_session, run_options
from service.manifest import GraphKey, Manifest
from service.settings import Settings
from service.tensors import Batch

log = logging.getLogger(__name__)

Side = Literal["left", "right"]  # which end truncation cuts


class DeviceUnavailable(RuntimeError):
    """The settings demand a GPU (or a graph) that this machine or bundle cannot give."""


@dataclass(frozen=True)
class RuntimeInfo:
    providers: list[str]
    graph: GraphKey
    precision: str

    @property
    def device(self) -> str:
        return "cuda" if self.providers[0] == CUDA else "cpu"


class Backend(Protocol):
    """Everything the core and the pipelines call on a model; tests use a fake."""

    manifest: Manifest
    info: RuntimeInfo
    token_output: bool  # the serving graph also outputs token_embeddings (B, N, d)
    # Sequences longer than this run in their own session (run_long); 0: no long lane.
    long_tokens: int
    # Its runs are bounded CPU work, so a small one may run on the event loop when the server
    # is otherwise idle (the batcher's inline runs). False on a GPU: a run waits on the device.
    inline: bool
    # Its runs take the time the machine takes for them, so warm-up can time them (a test's
    # fake backend, gated by the test, cannot be).
    measurable: bool

    def tokenize(
        self, texts: list[str], add_special_tokens: bool = True, direction: Side = "right"
    ) -> list[Encoding]: ...
    def tokenize_pairs(self, pairs: list[tuple[str, str]]) -> list[Encoding]: ...
    def count_tokens(self, text: str) -> int: ...
    def tokenize_whole(self, texts: list[str]) -> list[Encoding]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def run(self, batch: Batch) -> np.ndarray: ...
    def run_tokens(self, batch: Batch) -> np.ndarray | None: ...
    def attend(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]: ...
    def run_long(self, batch: Batch) -> np.ndarray: ...
    def run_outputs(self, batch: Batch, long: bool = False) -> dict[str, np.ndarray]: ...
    def warmup(self) -> None: ...


def choose_providers(device: str, available: list[str]) -> list[str]:
    """CUDA first when asked for (or auto) and available, CPU always as the fallback."""
    if device == "cpu":
        return [CPU]
    if CUDA in available:
        return [CUDA, CPU]
    if device == "cuda":
        raise DeviceUnavailable(
            f"HEADWISE_DEVICE=cuda but ONNX Runtime offers only {available}: install "
            "onnxruntime-gpu with a matching CUDA/cuDNN, or set HEADWISE_DEVICE=auto"
        )
    log.warning("CUDA execution provider not available (%s): serving on the CPU", available)
    return [CPU]


def choose_graph(bundle: Bundle, precision: str, on_cuda: bool) -> GraphKey:
    """Manifest key of the serving graph for this precision and device."""
    if precision == "auto":
        return "encoder_fp16" if on_cuda and bundle.has_graph("encoder_fp16") else "encoder"
    keys: dict[str, GraphKey] = {"fp32": "encoder", "fp16": "encoder_fp16", "int8": "encoder_int8"}
    key = keys[precision]
    if not bundle.has_graph(key):
        flag = {"encoder_fp16": "--fp16", "encoder_int8": "--int8"}.get(key, "")
        raise DeviceUnavailable(f"precision {precision} needs a bundle exported with {flag}")
    return key


def _inputs(session: ort.InferenceSession) -> list[str]:
    return [i.name for i in session.get_inputs()]


class OnnxBackend:
    def __init__(self, bundle: Bundle, settings: Settings, spin: bool = True) -> None:
        self.bundle = bundle
        self.manifest = bundle.manifest
        self.tokenizer = self._tokenizer("right")
        self._left = self._tokenizer("left")  # TEI's truncation_direction: Left
        self._untruncated = Tokenizer.from_file(str(bundle.tokenizer_path))
        self._untruncated.no_truncation()
        providers = choose_providers(settings.device, ort.get_available_providers())
        graph = choose_graph(bundle, settings.precision, providers[0] == CUDA)
        # Memory: the default ("shrink") hands the arena's regions back after every run, so RSS
        # follows the batch in flight, not the largest ever seen (bench/arena.py measures it).
        arena = settings.memory != "off"
        self._run_opts = run_options(settings.memory)
        self.session = build_session(
            bundle.graph_path(graph), providers, settings.threads, spin and settings.spinning, arena
        )
        self._feeds = _inputs(self.session)
        outputs = [o.name for o in self.session.get_outputs()]
        self._primary = outputs[:1]  # ask for the pooled output only: no token copy per run
        self.token_output = "token_embeddings" in outputs
        self._tokens = ["token_embeddings"] if self.token_output else None
        # /encode's outputs: all of them but the token states, in one run.
        self._outputs = [o for o in outputs if o != "token_embeddings"]
        used = self.session.get_providers()
        if settings.device == "cuda" and CUDA not in used:
            raise DeviceUnavailable(
                f"HEADWISE_DEVICE=cuda but the CUDA provider failed to start for {graph} "
                f"(providers: {used}): is the NVIDIA driver there (--gpus all)?"
            )
        if providers[0] == CUDA and CUDA not in used:
            log.warning("CUDA provider failed to start; serving on the CPU")
            if graph != (cpu_graph := choose_graph(bundle, settings.precision, on_cuda=False)):
                graph = cpu_graph  # the fp16 graph was chosen for the GPU: slow on a CPU
                self.session = build_session(
                    bundle.graph_path(graph), used, settings.threads, spin and settings.spinning
                )
        self.info = RuntimeInfo(used, graph, self.manifest.graphs[graph].precision)
        self.inline = self.info.device == "cpu"
        self.measurable = True
        # The long lane: one thread, no spinning, run at the lowest CPU priority by its batcher,
        # so that one long input cannot hold short ones back for seconds (a second copy of the
        # graph's weights; only for models whose inputs can be long). On a GPU runs are queued
        # on the device anyway: no second session.
        self.long_tokens = 0
        self.long_session = None
        lane = settings.long_tokens
        if lane and self.manifest.max_length > lane and self.info.device == "cpu":
            self.long_tokens = lane
            self.long_session = build_session(bundle.graph_path(graph), used, 1, False, arena)
        self.attention_session = None
        if settings.attention_enabled and bundle.has_graph("attention"):
            # Attention maps are fp32 on purpose: they are for looking at, not for speed.
            # Its threads never spin: an idle debug session must not steal the encoder's cores.
            # Few threads: a debug call must leave the cores to the encoder (attention_threads).
            self.attention_session = build_session(
                bundle.graph_path("attention"), used, settings.attention_threads, False, arena
            )
        log.info("%s: serving %s (%s) on %s", self.manifest.name, graph, self.info.precision, used[0])

    def _tokenizer(self, direction: Side) -> Tokenizer:
        tok = Tokenizer.from_file(str(self.bundle.tokenizer_path))
        tok.no_padding()
        tok.enable_truncation(max_length=self.manifest.max_length, direction=direction)
        return tok

    def tokenize(
        self, texts: list[str], add_special_tokens: bool = True, direction: Side = "right"
    ) -> list[Encoding]:
        tok = self.tokenizer if direction == "right" else self._left
        if len(texts) == 1:
            return [tok.encode(texts[0], add_special_tokens=add_special_tokens)]
        return tok.encode_batch(texts, add_special_tokens=add_special_tokens)

    def tokenize_pairs(self, pairs: list[tuple[str, str]]) -> list[Encoding]:
        return self.tokenizer.encode_batch(pairs)

    def tokenize_whole(self, texts: list[str]) -> list[Encoding]:
        """Without truncation, special tokens added: a document to cut into chunks."""
        return self._untruncated.encode_batch(texts)

    def count_tokens(self, text: str) -> int:
        """Length without truncation, for the error that names it."""
        return len(self._untruncated.encode(text).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def run(self, batch: Batch) -> np.ndarray:
        (out,) = self.session.run(self._primary, batch.feeds(self._feeds), self._run_opts)
        return np.asarray(out)

    def run_long(self, batch: Batch) -> np.ndarray:
        """As run, in the long lane's own session."""
        session = self.long_session or self.session
        (out,) = session.run(self._primary, batch.feeds(self._feeds), self._run_opts)
        return np.asarray(out)

    def run_outputs(self, batch: Batch, long: bool = False) -> dict[str, np.ndarray]:
        """Every output but the token states, by name, from one run (long: the long lane's)."""
        session = (self.long_session or self.session) if long else self.session
        values = session.run(self._outputs, batch.feeds(self._feeds), self._run_opts)
        return {name: np.asarray(v) for name, v in zip(self._outputs, values, strict=True)}

    def run_tokens(self, batch: Batch) -> np.ndarray | None:
        """Last-layer token vectors (B, N, d); None when the graph does not output them."""
        if self._tokens is None:
            return None
        (out,) = self.session.run(self._tokens, batch.feeds(self._feeds), self._run_opts)
        return np.asarray(out)

    def attend(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        if self.attention_session is None:
            raise RuntimeError("attention graph not loaded")
        primary, attn = self.attention_session.run(
            None, batch.feeds(_inputs(self.attention_session)), self._run_opts
        )
        return primary, attn

    def warmup(self) -> None:
        """Each session once, at the longest input it will run (the long lane's: a short one,
        only to load its kernels: at 8,192 tokens a warm-up batch held 8 GB and took 20 s)."""
        longest = self.long_tokens or self.manifest.max_length
        for n in (8, longest):
            ids = np.full((2, n), 5, dtype=np.int64)
            batch = Batch(ids, np.ones_like(ids))
            self.run(batch)
            if self.attention_session is not None and n <= 64:
                self.attend(batch)
        if self.long_session is not None:
            ids = np.full((1, 8), 5, dtype=np.int64)
            self.run_long(Batch(ids, np.ones_like(ids)))
