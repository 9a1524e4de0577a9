"""OpenVINO behind the part of ONNX Runtime's session that the backend calls: a second session
factory for the same bundle graph (../shared/STYLE.md 24), not a second backend.

OpenVINO's CPU plugin reads the bundle's fused ONNX graph as it is (its frontend knows ONNX
Runtime's `com.microsoft` fused ops: Attention, EmbedLayerNormalization, SkipLayerNormalization,
BiasGelu) and compiles it for this CPU: in bf16 on AMX or AVX-512-BF16 units when asked
(`INFERENCE_PRECISION_HINT`), else in fp32. On a CPU without bf16 units it compiles fp32 even when
bf16 is asked, so the precision a session reports is the compiled model's own, read back after
compiling, never the one asked for.

One compiled model: with one stream and every thread by default (one batch at a time, the lowest
latency of one text), or with `streams` streams, each on its share of the cores (the batcher then
runs that many batches at once, one per thread). Under load on 2 cores two batches at once beat
one with both threads: the threads of one run wait for each other at every op, and the server's
own request handling keeps taking one of them away. A text alone is slower on one stream's share
(bench/streams.py measures both), so with streams a batch alone on the session (engine/alone.py:
the batcher's, with nothing queued behind it or running) runs on a second compile with every
thread, and the batcher starts no other batch beside it (tried without that rule, the lone batch
and the next overlapped on three threads and most of the gain was lost). On 2 cores with AMX, two
streams so gave 1.14-1.18x one stream's texts/s under load at 0.97x one text's p50, for about
550 MB more memory and 6 s more start. One infer request per calling thread and compile (a
batcher's inference thread, the long lane's, warm-up's): a request's output buffers are reused
by its next run, so each output asked for is copied out, and only those (the graph computes the
token states too; copying them on every run would cost megabytes a batch).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from service.engine import tiles
from service.engine.alone import ALONE, alone
from service.engine.cpu import threads_for
from service.manifest import Manifest, SpecialTokens
from service.tensors import Batch

log = logging.getLogger(__name__)

PROVIDER = "OpenVINO CPU"
# headwise's names -> OpenVINO's hint. int8: the IR's FakeQuantize nodes run on the int8
# kernels, everything else in f32 (not bf16, where the CPU has it: nearest fp32).
PRECISIONS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def available() -> str | None:
    """OpenVINO's version when it can be imported here, else None."""
    try:
        import openvino
    except ImportError:
        return None
    return str(openvino.get_version()).split("-")[0]


def bf16_capable() -> bool:
    """OpenVINO's own reading of this CPU: can it compute bf16 (its BF16 capability)?"""
    import openvino

    caps = openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return "BF16" in caps


@dataclass(frozen=True)
class Port:
    """What the backend reads of a session's input or output: its name."""

    name: str


class OpenVinoSession:
    def __init__(
        self,
        path: Path | str,
        precision: str = "fp32",
        threads: int = 0,
        streams: int = 1,
        lone: bool = True,
        padding: tiles.Padding | None = None,
        most: int | None = None,
    ) -> None:
        """precision: fp32 or bf16 (asked; `precision` is what was compiled), or int8 (an NNCF
        graph). threads: 0 = one per CPU this process may use (engine/cpu.py's cores), else
        that many (the long lane's one). streams: batches run at once (1: one with every thread).
        padding: the lengths batches run at (engine/tiles.py); None: measured here when the
        model compiled in bf16, else none. most: the longest a batch may be padded to (the
        model's max_length: its position table ends there)."""
        import openvino

        core = openvino.Core()
        model = core.read_model(str(path))
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": PRECISIONS[precision]}
        if streams > 1:  # the threads shared among the streams
            config |= {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": streams}
        else:  # one stream with every thread: the batcher runs one batch at a time
            config["PERFORMANCE_HINT"] = "LATENCY"
        if count := threads_for(threads):  # 0: OpenVINO's own (every CPU, none restricted)
            config["INFERENCE_NUM_THREADS"] = count
        self.compiled = core.compile_model(model, "CPU", config)
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))
        # With streams, a batch alone on the session (engine/alone.py) runs on a second compile
        # with every thread, as one stream would run it: the lowest latency of one text.
        self._lone: Any = None
        if self.streams > 1 and lone:
            latency = {k: v for k, v in config.items() if k not in ("NUM_STREAMS",)}
            latency["PERFORMANCE_HINT"] = "LATENCY"
            self._lone = core.compile_model(model, "CPU", latency)
        # A Type, not a string: str() of it reads "<Type: 'bfloat16'>".
        bf16 = self.compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.bf16
        self.precision = "int8" if precision == "int8" else "bf16" if bf16 else "fp32"
        self._inputs = [Port(p.get_any_name()) for p in self.compiled.inputs]
        self._outputs = [Port(p.get_any_name()) for p in self.compiled.outputs]
        # Outputs with a length axis (token states, token weights): cut back after padding.
        self._by_token = {
            p.get_any_name()
            for p in self.compiled.outputs
            if p.get_partial_shape().rank.get_length() >= 2 and p.get_partial_shape()[1].is_dynamic
        }
        self._local = threading.local()
        self._requests: list[Any] = []  # every thread's (warm)
        self._lengths = 0  # warm: each request runs one text of every length up to this
        if padding is None:
            padding = (
                tiles.measure(self.timer())
                if self.precision == "bf16"
                else tiles.never(f"{self.precision} follows the tokens (bench/tiles.py)")
            )
        self.padding = padding
        self._most = most

    @property
    def lone(self) -> bool:
        """Runs alone (engine/alone.py) go to a compile with every thread."""
        return self._lone is not None

    def get_inputs(self) -> list[Port]:
        return self._inputs

    def get_outputs(self) -> list[Port]:
        return self._outputs

    def get_providers(self) -> list[str]:
        return [PROVIDER]

    def _request(self) -> Any:
        lone = self._lone is not None and ALONE.get()
        slot = "lone" if lone else "request"
        request = getattr(self._local, slot, None)
        if request is None:
            compiled = self._lone if lone else self.compiled
            request = compiled.create_infer_request()
            setattr(self._local, slot, request)
            self._requests.append(request)
            self._warm(request)
        return request

    def warm(self, lengths: int, shared: int = 0) -> None:
        """Each infer request, now and as each new thread makes its own, runs one text of every
        length up to `lengths` before it serves. A request's first run at a shape it has not
        run took 1.5-2x its steady time (on 2 AVX2 cores and on 2 with bf16: 4.6 vs 2.4 ms at
        11 tokens in bf16), even where another request had run that shape: what is prepared per
        shape is partly the request's own. 64 lengths take about 0.4 s a request.
        shared: then this thread's request alone runs one text of every longer length up to
        `shared`, once. Most of a shape's preparation is the compiled model's, shared by every
        request (2 cores with AMX, bf16: a new length's first run +4.5-9 ms, +0.8-1.0 ms where
        another request had run it), so that one pass spares every serving request most of it,
        for about 2.5 s of start (65-256 tokens there). The lone compile (streams) runs them
        too: its shapes are prepared apart (a lone run at 100-256 tokens paid 2.5-4x after the
        streams' request had run them; another stream's request 1.1-1.4x)."""
        self._lengths = lengths
        for request in self._requests:
            self._warm(request)
        if shared > lengths:
            self._warm(self._request(), range(lengths + 1, shared + 1))
            if self._lone is not None:  # a compile of its own: its shapes are its own
                with alone():
                    self._warm(self._request(), range(lengths + 1, shared + 1))

    def _warm(self, request: Any, lengths: range | None = None) -> None:
        names = [i.name for i in self._inputs]
        for n in lengths if lengths is not None else range(1, self._lengths + 1):
            ids = np.full((1, n), 5, dtype=np.int64)
            request.infer(
                Batch(ids, np.ones_like(ids)).feeds(names), share_inputs=True, share_outputs=True
            )

    def timer(self) -> Any:
        """time_of(rows, length) for tiles.measure: a request of its own runs the shape once
        (a first run prepares it), then the best of two."""
        request = self.compiled.create_infer_request()
        names = [i.name for i in self._inputs]

        def time_of(rows: int, n: int) -> float:
            ids = np.full((rows, n), 5, dtype=np.int64)
            feeds = Batch(ids, np.ones_like(ids)).feeds(names)
            request.infer(feeds, share_inputs=True, share_outputs=True)
            best = float("inf")
            for _ in range(2):
                started = time.perf_counter()
                request.infer(feeds, share_inputs=True, share_outputs=True)
                best = min(best, time.perf_counter() - started)
            return best

        return time_of

    def _padded(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The feeds at the length `padding` runs them at (0s past the batch's own, masked),
        and the batch's own length (0 when these are not a text batch's inputs)."""
        ids = feeds.get("input_ids")
        if ids is None or ids.ndim != 2 or not feeds.keys() <= tiles.TOKEN_INPUTS:
            return feeds, 0
        n = ids.shape[1]
        m = self.padding.length(len(ids), n, self._most)
        if m == n:
            return feeds, n
        return {k: np.pad(v, ((0, 0), (0, m - n))) for k, v in feeds.items()}, n

    def run(
        self, names: list[str] | None, feeds: dict[str, np.ndarray], run_options: Any = None
    ) -> list[np.ndarray]:
        """ONNX Runtime's `run`: the named outputs (None: all), each copied out of the request
        (a token-level output cut back to the batch's own length where padding lengthened it)."""
        padded, n = self._padded(feeds)
        result = self._request().infer(padded, share_inputs=True, share_outputs=True)
        wanted = names if names is not None else [o.name for o in self._outputs]
        if padded is feeds:
            return [np.array(result[name], copy=True) for name in wanted]
        return [
            np.array(result[name][:, :n] if name in self._by_token else result[name], copy=True)
            for name in wanted
        ]


# --- Agreement with ONNX Runtime, checked before a graph is served on OpenVINO ------------------

# The worst a row may differ from ONNX Runtime's: vectors by cosine, scores (one number a row)
# by their largest difference relative to the largest score. fp32 differs by summation order
# only; bf16 by its 8-bit mantissa (the bound: embeddings at cosine 0.999).
# int8: export's floor against a broken quantiser; what int8 is worth is the retrieval gate's.
MIN_COSINE = {"fp32": 0.99999, "bf16": 0.999, "int8": 0.95}
MAX_SCORE_DIFF = {"fp32": 1e-3, "bf16": 3e-2, "int8": 1e-1}


def probe_batch(manifest: Manifest) -> Batch:
    """Sequences of several lengths (the longest up to 160 tokens: past a ModernBERT's local
    window of 128), so that the others are padded: where a runtime's masking would differ."""
    return probe_of(manifest.special_tokens, manifest.vocab_size, manifest.max_length)


def probe_of(specials: SpecialTokens, vocab_size: int, max_length: int) -> Batch:
    """probe_batch before there is a manifest (export judging OpenVINO's int8 graph by it)."""
    rng = np.random.default_rng(0)
    special = [t for t in (specials.cls, specials.sep, specials.pad) if t is not None]
    low = max(special) + 1

    def draw(n: int) -> list[int]:
        """Ids past the special tokens; where those end the vocabulary (CLIP's), any other."""
        if low < vocab_size:
            ids = rng.integers(low, vocab_size, size=n)
        else:
            ids = rng.choice(np.setdiff1d(np.arange(vocab_size), special), n)
        return [int(i) for i in ids]

    lengths = [min(max_length, n) for n in (160, 7, 33, 2)]  # within its positions
    sequences = []
    for n in lengths:
        ids = draw(n)
        if specials.cls is not None and n > 2:
            ids[0] = specials.cls
        if specials.sep is not None and n > 2:
            ids[-1] = specials.sep
        sequences.append(ids)
    return Batch.of(sequences, specials.pad)


def padded_probe(batch: Batch, padding: tiles.Padding, most: int) -> Batch | None:
    """`batch` cut to the longest length that `padding` runs longer (its longest rows' tails
    dropped): the probe of padding's own agreement; None when it lengthens no length here."""
    rows, n = batch.input_ids.shape
    for cut in range(n - 1, padding.tile, -1):
        if padding.length(rows, cut, most) > cut:
            types = batch.token_type_ids
            return replace(
                batch,
                input_ids=batch.input_ids[:, :cut],
                attention_mask=batch.attention_mask[:, :cut],
                token_type_ids=None if types is None else types[:, :cut],
            )
    return None


def disagreement(
    session: OpenVinoSession, reference: Any, batch: Batch, precision: str
) -> str | None:
    """None when every output of `session` agrees with `reference` (an ONNX Runtime session of
    the same graph) on `batch`, else which output differs and by how much."""
    names = [o.name for o in reference.get_outputs()]
    feeds = batch.feeds([i.name for i in reference.get_inputs()])
    want = reference.run(names, feeds)
    got = session.run(names, feeds)
    real = batch.attention_mask.astype(bool)
    for name, a, b in zip(names, got, want, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return f"{name} has shape {a.shape}, ONNX Runtime's {b.shape}"
        if a.ndim == 3:  # token states: the real tokens' rows
            a, b = a[real], b[real]
        a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
        if a.shape[1] == 1:
            diff = float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))
            if not diff <= MAX_SCORE_DIFF[precision]:
                return f"{name} differs from ONNX Runtime's by {diff:.2g} of its largest value"
            continue
        norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        live = norms > 0
        cos = (a * b).sum(1)[live] / norms[live]
        worst = float(cos.min()) if cos.size else 1.0
        if not worst >= MIN_COSINE[precision]:
            return (
                f"{name} at cosine {worst:.5f} to ONNX Runtime's (at least {MIN_COSINE[precision]})"
            )
    return None
