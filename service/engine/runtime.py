"""The backend interface the pipelines talk to, and its ONNX Runtime implementation.

pre:  tokenize(texts) / tokenize_pairs(pairs) -> encodings (truncated at the max length)
core: run(batch) -> (B, d) pooled embeddings or (B, labels) logits   (the fused serving graph)
      run_outputs(batch) -> every output by name (sparse, token vectors; one run)
      attend(batch) -> primary output, attentions (L, B, h, N, N)     (the unfused debug graph)
      gated(batch) -> primary output, each row with its head gates     (the same graph)
      run_images(batch) -> (B, d) image vectors            (an image-text model's vision tower)
      attend_images(batch) -> image vectors, attentions (and SigLIP's pooling probe's map)
post: normalisation, dimensions, activations are per request, in the pipelines
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from service.bundle import Bundle
from service.engine import openvino_session, quality, tiles
from service.engine.choice import Choice, Unservable, choose
from service.engine.cpu import auto_streams, cores, detect, threads_for
from service.engine.openvino_session import OpenVinoSession
from service.engine.pairs import PairTruncation
from service.engine.sessions import CPU, CUDA, build_session, run_options
from service.manifest import GraphKey, Manifest, RetrievalQuality
from service.settings import Settings
from service.tensors import Batch

log = logging.getLogger(__name__)

Side = Literal["left", "right"]  # which end truncation cuts
SHORT_SHAPES = 64  # OpenVINO: one text of each length up to this is run on every thread
SHARED_SHAPES = 256  # ... and up to this once, on warm-up's own (openvino_session.warm)


class DeviceUnavailable(RuntimeError):
    """The settings demand a GPU (or a graph) that this machine or bundle cannot give."""


@dataclass(frozen=True)
class RuntimeInfo:
    providers: list[str]
    graph: GraphKey
    precision: str  # what computes: the graph's, or the one OpenVINO compiled it in
    runtime: str = "onnxruntime"
    reason: str = ""  # why this runtime and precision (service/engine/choice.py)
    # OpenVINO: the lengths batches run at (engine/tiles.py), described; None elsewhere.
    padding: dict[str, Any] | None = None

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
    # Batches its serving session computes at once (OpenVINO's streams; 1 elsewhere).
    streams: int
    # With streams: a batch alone runs on a second compile with every thread (engine/alone.py).
    lone: bool

    def tokenize(
        self, texts: list[str], add_special_tokens: bool = True, direction: Side = "right"
    ) -> list[Encoding]: ...
    def tokenize_pairs(self, pairs: list[tuple[str, str]]) -> list[Encoding]: ...
    def pair_ids(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int], bool]]:
        """Each pair's ids, type ids and whether it was cut (as tokenize_pairs cuts it)."""
        ...

    def count_tokens(self, text: str) -> int: ...
    def tokenize_whole(self, texts: list[str]) -> list[Encoding]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def run(self, batch: Batch) -> np.ndarray: ...
    def run_tokens(self, batch: Batch) -> np.ndarray | None: ...
    def attend(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]: ...
    def gated(self, batch: Batch) -> np.ndarray: ...
    def run_images(self, batch: Batch) -> np.ndarray: ...
    def attend_images(self, batch: Batch) -> list[np.ndarray]: ...
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


def openvino_graph(bundle: Bundle, choice: Choice) -> GraphKey:
    """OpenVINO's serving graph: the fused fp32 graph (compiled in fp32 or bf16), or the
    bundle's NNCF int8 IR."""
    if choice.precision != "int8":
        return "encoder"
    if not bundle.has_graph("encoder_int8_openvino"):
        raise DeviceUnavailable(
            "int8 on OpenVINO needs the bundle's OpenVINO int8 graph: export with --int8 where "
            "openvino and nncf are installed (pip install -e '.[export]'), or serve ONNX "
            "Runtime's int8 (HEADWISE_RUNTIME=onnxruntime)"
        )
    return "encoder_int8_openvino"


def pad_to_length(tok: Tokenizer, length: int, pad_id: int) -> None:
    """Every text padded to `length` with the pad token, as a SigLIP model card runs its text
    tower (padding="max_length", no attention mask): the padding is part of the sequence,
    attended to like its tokens (Manifest.text_padding "max_length")."""
    token = tok.id_to_token(pad_id)
    if token is None:
        raise ValueError(f"the pad id {pad_id} is not in the tokenizer's vocabulary")
    tok.enable_padding(length=length, pad_id=pad_id, pad_token=token)


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
        self._pairs = (
            PairTruncation(str(bundle.tokenizer_path), self.manifest.max_length, self.tokenizer)
            if self.manifest.text_padding != "max_length"
            else None
        )
        providers = choose_providers(settings.device, ort.get_available_providers())
        try:
            choice = choose(settings, detect(), providers[0] == CUDA, openvino_session.available())
        except Unservable as exc:
            raise DeviceUnavailable(str(exc)) from None
        if choice.runtime == "openvino":
            providers = [CPU]  # the attention graph stays on ONNX Runtime's CPU provider
        graph: GraphKey = (
            openvino_graph(bundle, choice)
            if choice.runtime == "openvino"
            else choose_graph(bundle, settings.precision, providers[0] == CUDA)
        )
        # Memory: the default ("shrink") hands the arena's regions back after every run, so RSS
        # follows the batch in flight, not the largest ever seen (bench/arena.py measures it).
        arena = settings.memory != "off"
        self._run_opts = run_options(settings.memory)
        self.session: Any = None
        self.quality: RetrievalQuality | None = None  # a served precision's gate, when judged
        if choice.runtime == "openvino":
            self.session, choice = self._openvino(bundle, graph, choice, settings)
            if self.session is None:
                graph = "encoder"
        if self.session is None:
            self.session = build_session(
                bundle.graph_path(graph),
                providers,
                settings.threads,
                spin and settings.spinning,
                arena,
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
        computes: str = self.manifest.graphs[graph].precision
        padding = None
        if isinstance(self.session, OpenVinoSession):
            computes = self.session.precision
            padding = self.session.padding.describe()
        self.info = RuntimeInfo(used, graph, computes, choice.runtime, choice.reason, padding)
        self.inline = self.info.device == "cpu"
        self.measurable = True
        self.streams = getattr(self.session, "streams", 1)
        # With streams: a batch alone runs on a compile with every thread (openvino_session).
        self.lone = bool(getattr(self.session, "lone", False))
        # The long lane: one thread, no spinning, run at the lowest CPU priority by its batcher,
        # so that one long input cannot hold short ones back for seconds (a second copy of the
        # graph's weights; only for models whose inputs can be long). On a GPU runs are queued
        # on the device anyway: no second session.
        self.long_tokens = 0
        self.long_session = None
        lane = settings.long_tokens
        if lane and self.manifest.max_length > lane and self.info.device == "cpu":
            self.long_tokens = lane
            if isinstance(self.session, OpenVinoSession):
                self.long_session = OpenVinoSession(
                    bundle.graph_path(graph),
                    computes,
                    threads=1,
                    padding=self.session.padding,
                    most=self.manifest.max_length,
                )
            else:
                self.long_session = build_session(bundle.graph_path(graph), used, 1, False, arena)
        self.attention_session = None
        if settings.attention_enabled and bundle.has_graph("attention"):
            # Attention maps are fp32 on purpose: they are for looking at, not for speed.
            # Its threads never spin: an idle debug session must not steal the encoder's cores.
            # Few threads: a debug call must leave the cores to the encoder (attention_threads).
            self.attention_session = build_session(
                bundle.graph_path("attention"),
                [CPU] if isinstance(self.session, OpenVinoSession) else used,
                settings.attention_threads,
                False,
                arena,
            )
        # An image-text model's vision tower: on ONNX Runtime (its fp16 graph where the text's
        # is), threads that never spin (one session spins: the text tower's), its maps in fp32.
        self.vision_session = None
        self.vision_attention_session = None
        self.vision_graph: GraphKey | None = None
        vision = self.manifest.vision
        if vision is not None:
            self.vision_graph = graph if graph in vision.graphs else "encoder"
            providers = [CPU] if isinstance(self.session, OpenVinoSession) else used
            self.vision_session = build_session(
                bundle.vision_path(self.vision_graph), providers, settings.threads, False, arena
            )
            if settings.attention_enabled and "attention" in vision.graphs:
                self.vision_attention_session = build_session(
                    bundle.vision_path("attention"),
                    providers,
                    settings.attention_threads,
                    False,
                    arena,
                )
        log.info(
            "%s: serving %s (%s) on %s: %s; threads for %s",
            self.manifest.name,
            graph,
            self.info.precision,
            used[0],
            self.info.reason,
            cores().why,
        )

    def _openvino(
        self, bundle: Bundle, graph: GraphKey, choice: Choice, settings: Settings
    ) -> tuple[OpenVinoSession | None, Choice]:
        """The graph compiled by OpenVINO, once its outputs agree with ONNX Runtime's on a padded
        probe batch; else None and ONNX Runtime, with the reason (a family whose fused ops
        OpenVINO reads differently is served right, on the runtime it was exported for)."""
        path = bundle.graph_path(graph)
        try:
            usable = threads_for(settings.threads) or cores().usable
            streams = settings.openvino_streams or auto_streams(usable, detect().flags)
            padding = None
            if not settings.openvino_padding:
                padding = tiles.never("HEADWISE_OPENVINO_PADDING is off")
            session = OpenVinoSession(
                path,
                choice.precision,
                settings.threads,
                streams,
                padding=padding,
                most=self.manifest.max_length,
            )
        except Exception as exc:  # OpenVINO raises RuntimeError and its own kinds
            failed = f"OpenVINO cannot compile {path.name} ({str(exc).splitlines()[0][:200]})"
        else:
            if session.precision != choice.precision:
                failed = (
                    f"OpenVINO compiled {path.name} in {session.precision}, not {choice.precision}"
                )
            else:
                # The reference is the fp32 graph (an int8 IR is OpenVINO's alone).
                reference = build_session(bundle.graph_path("encoder"), [CPU], settings.threads)
                probe = openvino_session.probe_batch(self.manifest)
                why = openvino_session.disagreement(session, reference, probe, choice.precision)
                if why is None:
                    self._check_padding(session, reference, probe, choice.precision)
                if why is not None:
                    failed = f"OpenVINO's {path.name} disagrees with ONNX Runtime's: {why}"
                else:
                    recorded = self.manifest.graphs[graph].quality  # export's gate, if any
                    judged = self._judged(session, reference, choice, settings, recorded)
                    if judged is None:
                        return session, choice
                    failed = judged
        if settings.precision in ("bf16", "int8"):  # asked for: refused with the reason
            raise DeviceUnavailable(f"{self.manifest.name}: {failed}")
        log.warning("%s: %s: serving on ONNX Runtime", self.manifest.name, failed)
        return None, Choice("onnxruntime", "auto", f"{choice.reason}; but {failed}: ONNX Runtime")

    def _check_padding(
        self, session: OpenVinoSession, reference: Any, probe: Batch, precision: str
    ) -> None:
        """The probe again, cut to a length the session pads (engine/tiles.py): where its answers
        then differ from ONNX Runtime's, the session runs every batch at its own length."""
        cut = openvino_session.padded_probe(probe, session.padding, self.manifest.max_length)
        if cut is None:
            return
        why = openvino_session.disagreement(session, reference, cut, precision)
        if why is not None:
            said = f"a batch padded to the tile disagrees with ONNX Runtime's: {why}"
            log.warning("%s: %s: batches run at their own length", self.manifest.name, said)
            session.padding = tiles.never(said)

    def _judged(
        self,
        session: OpenVinoSession,
        reference: Any,
        choice: Choice,
        settings: Settings,
        recorded: RetrievalQuality | None = None,
    ) -> str | None:
        """A precision below fp32 is served only when it keeps retrieval: an embedding model's
        recall@10 and MRR on real query -> document pairs within 0.5 point of the fp32 graph's,
        both run here (service/engine/quality.py), on its first output (a multi-vector model's
        token vectors averaged over the real tokens). None: it does (figures in self.quality)."""
        if choice.precision == "fp32" or self.manifest.task != "embed":
            return None
        # A graph gated at export (OpenVINO's int8) is judged again on the same pairs: on a
        # subset its verdict could differ (a query flipped is 0.2 point of 500 pairs).
        limit = recorded.pairs if recorded is not None else settings.precision_gate_pairs
        pairs = quality.docstring_pairs("gate", limit=limit)
        inputs = [i.name for i in reference.get_inputs()]
        primary = [reference.get_outputs()[0].name]

        def runner(s: Any) -> quality.Run:
            def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
                out = np.asarray(s.run(primary, feeds)[0])
                if out.ndim == 3:  # token vectors (ColBERT): judged mean-pooled, not by MaxSim
                    mask = feeds["attention_mask"][..., None].astype(out.dtype)
                    out = (out * mask).sum(1) / np.maximum(mask.sum(1), 1.0)
                return out

            return run

        q = quality.judge(runner(reference), runner(session), self.tokenizer, inputs, pairs)
        self.quality = q
        verdict = quality.within(q, quality.MAX_DROP_POINTS, quality.MIN_SPEARMAN)
        log.info(
            "%s: %s %s the retrieval gate: %s",
            self.manifest.name,
            choice.precision,
            "passes" if verdict else "fails",
            quality.summary(q),
        )
        return (
            None
            if verdict
            else f"{choice.precision} fails the retrieval gate ({quality.summary(q)})"
        )

    def _tokenizer(self, direction: Side) -> Tokenizer:
        tok = Tokenizer.from_file(str(self.bundle.tokenizer_path))
        tok.no_padding()
        tok.enable_truncation(max_length=self.manifest.max_length, direction=direction)
        if self.manifest.text_padding == "max_length":
            pad_to_length(tok, self.manifest.max_length, self.manifest.special_tokens.pad)
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

    def pair_ids(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int], bool]]:
        """As tokenize_pairs, read (engine/pairs.py: cut without computing the overflow), or
        read from tokenize_pairs where every text is padded to the model's length."""
        if self._pairs is None:
            return [(e.ids, e.type_ids, bool(e.overflowing)) for e in self.tokenize_pairs(pairs)]
        return self._pairs(pairs)

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

    def gated(self, batch: Batch) -> np.ndarray:
        """The attention graph's primary output alone, each row with its head gates (a graph
        exported with them: GraphEntry.gated_parity)."""
        if self.attention_session is None:
            raise RuntimeError("attention graph not loaded")
        primary = self.attention_session.get_outputs()[0].name
        (out,) = self.attention_session.run(
            [primary], batch.feeds(_inputs(self.attention_session)), self._run_opts
        )
        return np.asarray(out)

    def _pixels(self, batch: Batch) -> dict[str, np.ndarray]:
        """The vision graphs' feed; a calibration batch (ids alone) runs blank images."""
        vision = self.manifest.vision
        if vision is None:
            raise RuntimeError(f"{self.manifest.name} has no vision tower")
        pixels = batch.pixel_values
        if pixels is None:
            size = (len(batch), vision.channels, vision.image_size, vision.image_size)
            pixels = np.zeros(size, dtype=np.float32)
        return {"pixel_values": pixels}

    def run_images(self, batch: Batch) -> np.ndarray:
        """Image vectors (B, d) in the text tower's space."""
        if self.vision_session is None:
            raise RuntimeError(f"{self.manifest.name} has no vision tower")
        (out,) = self.vision_session.run(["image_embeds"], self._pixels(batch), self._run_opts)
        return np.asarray(out)

    def attend_images(self, batch: Batch) -> list[np.ndarray]:
        """Image vectors, every layer's maps (L, B, h, N, N), and SigLIP's pooling probe's
        (B, h, 1, N); with the batch's head gates when it has any."""
        if self.vision_attention_session is None:
            raise RuntimeError("vision attention graph not loaded")
        feeds = self._pixels(batch)
        if batch.head_gates is not None:
            feeds["head_gates"] = batch.head_gates
        return [
            np.asarray(x) for x in self.vision_attention_session.run(None, feeds, self._run_opts)
        ]

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
        if isinstance(self.session, OpenVinoSession):
            # OpenVINO prepares each new shape on its first run, mostly for the compiled model,
            # partly per infer request (one per calling thread): +1.5-3.5 ms for one short text
            # on 2 AVX2 cores, +4.5-9 ms at 65-256 tokens on 2 with AMX. One text of every length
            # up to SHORT_SHAPES runs on every thread's request before it serves, and of every
            # longer one up to SHARED_SHAPES once, here (larger batches amortise the rest).
            longest = self.manifest.max_length
            self.session.warm(min(SHORT_SHAPES, longest), shared=min(SHARED_SHAPES, longest))
        if self.long_session is not None:
            ids = np.full((1, 8), 5, dtype=np.int64)
            self.run_long(Batch(ids, np.ones_like(ids)))
        if self.vision_session is not None:
            blank = Batch(np.zeros((2, 1), dtype=np.int64), np.ones((2, 1), dtype=np.int64))
            self.run_images(blank)
            if self.vision_attention_session is not None:
                self.attend_images(blank)
