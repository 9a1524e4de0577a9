"""OnnxEncoder: the bundle's tokenizer and ONNX Runtime sessions behind a narrow interface.

pre:  tokenize(texts) -> encodings             (batch, truncation at max length)
core: embed(ids, mask) -> (B, d) float32       (the fused serving graph)
      attend(ids, mask) -> (B, d), (L, B, h, N, N)   (the unfused debug graph)
post: pooling is in the graph; normalisation and dimensions are per request (embedder.py)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from service.bundle import Bundle
from service.settings import Settings

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class DeviceUnavailable(RuntimeError):
    """The settings demand a GPU that ONNX Runtime cannot use here."""


class Backend(Protocol):
    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]: ...
    def count_tokens(self, text: str) -> int: ...
    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray: ...
    def attend(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


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


def choose_graph(bundle: Bundle, precision: str, on_cuda: bool) -> str:
    """Manifest key of the serving graph for this precision and device."""
    if precision == "auto":
        return "encoder_fp16" if on_cuda and bundle.has_graph("encoder_fp16") else "encoder"
    key = {"fp32": "encoder", "fp16": "encoder_fp16", "int8": "encoder_int8"}[precision]
    if not bundle.has_graph(key):
        flag = {"encoder_fp16": "--fp16", "encoder_int8": "--int8"}.get(key, "")
        raise DeviceUnavailable(f"precision {precision} needs a bundle exported with {flag}")
    return key


@dataclass(frozen=True)
class RuntimeInfo:
    providers: list[str]
    graph: str
    precision: str

    @property
    def device(self) -> str:
        return "cuda" if self.providers[0] == CUDA else "cpu"


class OnnxEncoder:
    def __init__(self, bundle: Bundle, settings: Settings) -> None:
        self.bundle = bundle
        self.tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=bundle.manifest.max_length)
        self._untruncated = Tokenizer.from_file(str(bundle.tokenizer_path))
        self._untruncated.no_truncation()
        providers = choose_providers(settings.device, ort.get_available_providers())
        graph = choose_graph(bundle, settings.precision, providers[0] == CUDA)
        self.session = self._session(
            bundle.graph_path(graph), providers, settings, settings.spinning
        )
        used = self.session.get_providers()
        if settings.device == "cuda" and CUDA not in used:
            raise DeviceUnavailable(f"CUDA provider failed to start for {graph}; providers: {used}")
        if providers[0] == CUDA and CUDA not in used:
            log.warning("CUDA provider failed to start; serving on the CPU")
        self.info = RuntimeInfo(used, graph, bundle.manifest.graphs[graph].precision)
        self.attention_session = None
        if settings.attention_enabled:
            # Attention maps are fp32 on purpose: they are for looking at, not for speed.
            # Its threads never spin: an idle debug session must not steal the encoder's cores.
            self.attention_session = self._session(
                bundle.graph_path("attention"), used, settings, False
            )
        log.info("serving %s (%s) on %s", graph, self.info.precision, used[0])

    @staticmethod
    def _session(
        path, providers: list[str], settings: Settings, spin: bool
    ) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = settings.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning cuts the wake-up latency of every parallel op; several sessions spinning at
        # once fight for the cores (measured ~5x slower), so only the serving session spins.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        # ...and spinning past the end of a run steals the core the HTTP side needs next:
        # spin between the ops of a run, stop when it returns (measured: best of both).
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), opts, providers=providers)

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        if len(texts) == 1:
            return [self.tokenizer.encode(texts[0], add_special_tokens=add_special_tokens)]
        return self.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

    def count_tokens(self, text: str) -> int:
        """Length without truncation, for the error that names it."""
        return len(self._untruncated.encode(text).ids)

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (out,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask})
        return out

    def attend(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.attention_session is None:
            raise RuntimeError("attention graph not loaded")
        emb, attn = self.attention_session.run(None, {"input_ids": ids, "attention_mask": mask})
        return emb, attn

    def warmup(self) -> None:
        for n in (8, self.bundle.manifest.max_length):
            ids = np.full((2, n), 1000, dtype=np.int64)
            mask = np.ones_like(ids)
            self.embed(ids, mask)
            if self.attention_session is not None and n <= 64:
                self.attend(ids, mask)
