"""Every served family on OpenVINO (service/engine/openvino_session.py): the bundle's fused
serving graph compiled by OpenVINO gives ONNX Runtime's outputs (embeddings at cosine >= 0.999,
scores in the same order, sparse and token vectors alike), and a server started with
HEADWISE_RUNTIME=openvino answers as ONNX Runtime's does.

The rotary families (ModernBERT, NomicBERT, EmbeddingGemma, Qwen3's embedder and reranker) are
exported with ONNX Runtime's RotaryEmbedding and MultiHeadAttention ops; OpenVINO 2026.4 reads
them but computes other numbers (cosine 0.81-0.999 to ONNX Runtime's, padded rows worst). The
probe that start-up runs catches it, and those models are served on ONNX Runtime, /info saying
why: the tests hold both (that it is caught, and that the answers are ONNX Runtime's).

On this project's CI machines (AVX2, some AVX-512 without bf16) OpenVINO compiles fp32: these are
its fp32 parity tests. bf16 needs amx_bf16 or avx512_bf16; where the CPU has them the same tests
run in bf16 (the tolerance is the issue's: cosine 0.999), else they say why they do not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from export import verify
from service.engine import tiles
from service.engine.cpu import detect
from service.engine.openvino_session import OpenVinoSession, disagreement, probe_batch
from service.engine.sessions import build_session
from service.engine.tiles import TILE, Padding
from service.manifest import Manifest
from service.tensors import cosines
from tests.export.test_architectures import FAMILIES as ENCODERS
from tests.export.test_architectures import export, save_checkpoint
from tests.service.conftest import client_for

TEXTS = [
    "The cat sat on a warm mat.",
    "a",
    "Le chat dort sur le canapé depuis ce matin près de la fenêtre.",
    "the cat sat on a warm mat while rain fell " * 12,  # the longest: the others padded
]
PRECISIONS = ["fp32", "bf16"]
MIN_COSINE = {"fp32": 0.99999, "bf16": 0.999}


def _new_family(name: str, root: Path) -> Path:
    from tests.export.test_new_families import FAMILIES

    FAMILIES[name].save(root / "model")
    export(root / "model", root / "bundle")
    return root / "bundle"


def _encoder(name: str, tokenizers: dict[str, Path], root: Path) -> Path:
    _, kind, _ = ENCODERS[name]
    folder = save_checkpoint(root / "model", name, tokenizers[kind])
    export(folder, root / "bundle")
    return root / "bundle"


def _qwen3(kind: str, root: Path) -> Path:
    from tests.export.decoders import save, save_embedder

    if kind == "embedder":
        save_embedder(root / "model")
        export(root / "model", root / "bundle")
    else:
        save(root / "model", "Qwen3ForCausalLM", "reranker")
        export(root / "model", root / "bundle", "--task", "rerank")
    return root / "bundle"


def _splade(tokenizers: dict[str, Path], root: Path) -> Path:
    from tests.export.output_checkpoints import splade_checkpoint

    splade_checkpoint(root / "model", tokenizers["wordpiece"])
    export(root / "model", root / "bundle")
    return root / "bundle"


def _colbert(tokenizers: dict[str, Path], root: Path) -> Path:
    from tests.export.output_checkpoints import colbert_checkpoint

    colbert_checkpoint(root / "model", tokenizers["wordpiece"])
    export(root / "model", root / "bundle")
    return root / "bundle"


BUILT = {
    **{name: (lambda n: lambda t, r: _encoder(n, t, r))(name) for name in ENCODERS},
    **{
        name: (lambda n: lambda t, r: _new_family(n, r))(name)
        for name in ("modernbert", "nomic-bert", "gemma3", "deberta-v2")
    },
    "qwen3-embedder": lambda t, r: _qwen3("embedder", r),
    "qwen3-reranker": lambda t, r: _qwen3("reranker", r),
    "splade": _splade,
    "colbert": _colbert,
}
SHARED = {"default": "default_bundle", "ranker": "ranker_bundle", "bge-m3": "m3_bundle"}
# Served on ONNX Runtime even when OpenVINO is asked for: its probe finds them different.
DISAGREE = {"modernbert", "nomic-bert", "gemma3", "qwen3-embedder", "qwen3-reranker"}


@pytest.fixture(scope="module", params=[*SHARED, *BUILT])
def family(request, family_tokenizers, tmp_path_factory) -> tuple[str, Path]:
    name = request.param
    if name in SHARED:
        return name, request.getfixturevalue(SHARED[name])
    return name, BUILT[name](family_tokenizers, tmp_path_factory.mktemp(name))


def feeds(bundle: Path) -> tuple[Manifest, dict[str, np.ndarray]]:
    manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    return manifest, verify.encode(tok, TEXTS, manifest.inputs, manifest.special_tokens.pad)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_output_of_the_serving_graph_equals_onnx_runtimes(family, precision):
    if precision == "bf16" and not detect().bf16:
        pytest.skip(f"bf16 needs amx_bf16 or avx512_bf16; this CPU has {detect().describe()}")
    name, bundle = family
    manifest, x = feeds(bundle)
    graph = bundle / manifest.graphs["encoder"].file
    ort = build_session(graph)
    ov = OpenVinoSession(graph, precision)
    assert ov.precision == precision
    why = disagreement(ov, ort, probe_batch(manifest), precision)
    if name in DISAGREE:  # caught before serving: the model is served on ONNX Runtime
        assert why is not None and "ONNX Runtime's" in why
        return
    assert why is None, why
    assert_agrees(ov, ort, x, manifest.task, precision)


def assert_agrees(ov: OpenVinoSession, ort, x: dict[str, np.ndarray], task: str, precision: str):
    """Every output of `ov` on feeds `x` as ONNX Runtime's: vectors by cosine, scores close and
    in the same order."""
    names = [o.name for o in ort.get_outputs()]
    want = dict(zip(names, ort.run(names, x), strict=True))
    got = dict(zip(names, ov.run(names, x), strict=True))
    mask = x["attention_mask"].astype(bool)
    for name in names:
        a, b = got[name], want[name]
        assert a.shape == b.shape, name
        if a.ndim == 3:  # token states (B, N, d): the real tokens' rows
            a, b = a[mask], b[mask]
        if task == "embed" or a.ndim == 2 and a.shape[1] > 1 and name != "logits":
            assert cosines(a, b).min() >= MIN_COSINE[precision], name
        else:  # scores: close values, in the same order wherever fp32 tells them apart
            a, b = a.ravel(), b.ravel()
            tol = 1e-3 * max(1.0, float(np.abs(b).max()))
            assert np.abs(a - b).max() < tol, (name, a, b)
            # A random-weight ranker's scores can tie within bf16's resolution (4e-5 apart):
            # their order is noise. Pairs further apart than the tolerance keep theirs.
            apart = np.abs(b[:, None] - b[None, :]) > tol
            same = np.sign(a[:, None] - a[None, :]) == np.sign(b[:, None] - b[None, :])
            assert same[apart].all(), (name, a, b)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_batch_padded_to_the_tile_answers_as_at_its_own_length(family, precision):
    """Padding forced on every batch past a tile (engine/tiles.py; at start only where it
    measured faster): each family's outputs are still ONNX Runtime's at the batch's own length,
    the token-level ones cut back to it (the families served on ONNX Runtime, whose answers
    OpenVINO's differ from: OpenVINO's own without padding)."""
    if precision == "bf16" and not detect().bf16:
        pytest.skip(f"bf16 needs amx_bf16 or avx512_bf16; this CPU has {detect().describe()}")
    name, bundle = family
    manifest, x = feeds(bundle)
    graph = bundle / manifest.graphs["encoder"].file
    forced = Padding(rows=1, row=1)
    ov = OpenVinoSession(graph, precision, padding=forced, most=manifest.max_length)
    top = manifest.max_length // TILE * TILE  # the longest multiple of a tile within positions
    n = x["input_ids"].shape[1]
    if top > TILE and (n % TILE == 0 or n > top):  # cut the longest text: a tail to pad away
        x = {k: v[:, : min(n, top) - 1] for k, v in x.items()}
    padded, own = ov._padded(x)
    assert own == x["input_ids"].shape[1] > TILE
    if top > TILE:
        assert padded["input_ids"].shape[1] % TILE == 0 and padded["input_ids"].shape[1] > own
    else:  # its positions end within two tiles (ColBERT's test model: 24): never run past them
        assert padded is x
    unpadded = tiles.never("the reference")
    reference = OpenVinoSession(graph, precision, padding=unpadded) if name in DISAGREE else None
    assert_agrees(ov, reference or build_session(graph), x, manifest.task, precision)


def test_a_server_on_openvino_answers_as_onnx_runtimes(family):
    name, bundle = family
    manifest, _ = feeds(bundle)
    if manifest.task == "embed":
        path, body = "/encode", {"inputs": TEXTS, "outputs": manifest.outputs}
    elif manifest.task == "rerank":
        path, body = "/rerank", {"query": TEXTS[0], "texts": TEXTS, "raw_scores": True}
    else:
        path, body = "/predict", {"inputs": [[TEXTS[0], t] for t in TEXTS], "raw_scores": True}
    answers = {}
    for runtime in ("onnxruntime", "openvino"):
        # fp32 asked for: on a CPU with bf16 units OpenVINO's own choice is bf16 (tested below).
        with client_for(bundle, runtime=runtime, precision="fp32", calibration_s=0.5) as c:
            info = c.get("/info").json()
            served = "onnxruntime" if name in DISAGREE else runtime
            assert info["runtime"] == served and info["precision"] == "fp32"
            if runtime == "openvino":
                assert "HEADWISE_RUNTIME=openvino" in info["runtime_reason"]
                assert ("disagrees" in info["runtime_reason"]) == (name in DISAGREE)
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            answers[runtime] = r.json()
            if info["attention_enabled"] and manifest.task == "embed":  # still ONNX Runtime's
                assert c.post("/attention", json={"input": TEXTS[0]}).status_code == 200
    want, got = answers["onnxruntime"], answers["openvino"]
    if manifest.task != "embed":
        np.testing.assert_allclose(_scores(got), _scores(want), atol=1e-4, rtol=1e-4)
        return
    assert got["tokens"] == want["tokens"]
    if "embeddings" in want:
        assert cosines(np.array(got["embeddings"]), np.array(want["embeddings"])).min() > 0.99999
    for s_got, s_want in zip(got.get("sparse", []), want.get("sparse", []), strict=True):
        assert [e["index"] for e in s_got] == [e["index"] for e in s_want]
    for v_got, v_want in zip(
        got.get("multi_vector", []), want.get("multi_vector", []), strict=True
    ):
        assert cosines(np.array(v_got), np.array(v_want)).min() > 0.99999


def test_the_automatic_choice_on_a_bf16_cpu_serves_bf16_or_says_why_not(family):
    """HEADWISE_RUNTIME and HEADWISE_PRECISION left to headwise on a CPU with bf16 units: every
    family starts (a ColBERT model's token vectors once broke the start's retrieval judge), served
    by OpenVINO in bf16 with vectors near ONNX Runtime's fp32, or on ONNX Runtime fp32 with
    the reason (its probe disagrees, or bf16 fails the retrieval gate)."""
    if not detect().bf16:
        pytest.skip(f"bf16 needs amx_bf16 or avx512_bf16; this CPU has {detect().describe()}")
    name, bundle = family
    manifest, _ = feeds(bundle)
    if manifest.task != "embed":
        path, body = "/rerank", {"query": TEXTS[0], "texts": TEXTS, "raw_scores": True}
        if manifest.task != "rerank":
            path, body = "/predict", {"inputs": [[TEXTS[0], t] for t in TEXTS], "raw_scores": True}
    else:
        path, body = "/encode", {"inputs": TEXTS, "outputs": manifest.outputs}
    answers, infos = {}, {}
    for runtime in ("onnxruntime", "auto"):
        with client_for(bundle, runtime=runtime, precision="auto", calibration_s=0.5) as c:
            infos[runtime] = c.get("/info").json()
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            answers[runtime] = r.json()
    info = infos["auto"]
    served = (info["runtime"], info["precision"])
    if name in DISAGREE:
        assert served == ("onnxruntime", "fp32") and "disagrees" in info["runtime_reason"]
        return
    if served == ("onnxruntime", "fp32"):  # random weights: bf16 may lose their "retrieval"
        assert "fails the retrieval gate" in info["runtime_reason"], info["runtime_reason"]
        return
    assert served == ("openvino", "bf16"), info["runtime_reason"]
    want, got = answers["onnxruntime"], answers["auto"]
    if manifest.task != "embed":
        np.testing.assert_allclose(_scores(got), _scores(want), atol=3e-2, rtol=3e-2)
        return
    if "embeddings" in want:
        assert cosines(np.array(got["embeddings"]), np.array(want["embeddings"])).min() >= 0.999
    for v_got, v_want in zip(
        got.get("multi_vector", []), want.get("multi_vector", []), strict=True
    ):
        assert cosines(np.array(v_got), np.array(v_want)).min() >= 0.999


def _scores(answer) -> np.ndarray:
    """/rerank's answer by index; /predict's per input, its labels' scores by label."""
    if answer and "index" in answer[0]:
        return np.array([e["score"] for e in sorted(answer, key=lambda e: e["index"])])
    return np.array([[e["score"] for e in sorted(row, key=lambda e: e["label"])] for row in answer])


def test_every_threads_infer_request_runs_the_short_lengths_before_it_serves(tiny_bundle):
    """A request's first run at a shape it has not run took 1.5-2x its steady time, even where
    another request had run it: warm() warms the requests there are, and each thread's new
    request warms itself before its first run (the event loop's, the batcher's, the long
    lane's), with the same outputs as before. The longer lengths (`shared`), whose preparation
    is mostly the compiled model's, run once, on the calling thread's request only."""
    import threading

    session = OpenVinoSession(tiny_bundle / "encoder.onnx")
    warmed: list[tuple[int, tuple[int, int]]] = []
    real = session._warm

    def spy(request, lengths=None):
        span = (1, session._lengths) if lengths is None else (lengths.start, lengths[-1])
        warmed.append((threading.get_ident(), span))
        real(request, lengths)

    session._warm = spy
    ids = np.array([[101, 7592, 102]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    names = [i.name for i in session.get_inputs()]
    feeds = {k: v for k, v in feeds.items() if k in names} | (
        {"token_type_ids": np.zeros_like(ids)} if "token_type_ids" in names else {}
    )
    before = session.run(None, feeds)[0]  # this thread's request: nothing to warm yet
    session.warm(5, shared=9)  # ... warmed now, and the longer lengths once
    out: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: out.append(session.run(None, feeds)[0]))
    worker.start()
    worker.join()
    main = threading.get_ident()
    assert [(t == main, span) for t, span in warmed] == [
        (True, (1, 0)),
        (True, (1, 5)),
        (True, (6, 9)),
        (False, (1, 5)),
    ]
    np.testing.assert_allclose(out[0], before, rtol=1e-5, atol=1e-6)


def test_the_shared_lengths_warm_a_request_made_later(tiny_bundle):
    """warm(shared=...) from a thread without a request yet: its request is made, warmed to the
    short lengths, then runs the longer ones; no length is asked beyond `shared`."""
    session = OpenVinoSession(tiny_bundle / "encoder.onnx")
    lengths: list[int] = []
    real = session._warm
    session._warm = lambda r, span=None: (
        lengths.extend(span if span is not None else range(1, session._lengths + 1)),
        real(r, span),
    )
    session.warm(3, shared=7)
    assert lengths == list(range(1, 8))
    session.warm(3, shared=3)  # nothing longer to run
    assert lengths == list(range(1, 8)) + [1, 2, 3]


@pytest.mark.parametrize(
    ("cls", "sep", "pad", "vocab", "length"),
    [
        (101, 102, 0, 800, 512),  # BERT: specials low in the vocabulary
        (49406, 49407, 49407, 49408, 16),  # CLIP's specials end it; a tiny model's 16 positions
        (None, 1, 0, 50, 77),  # a pad at 0 and an end token
    ],
)
def test_the_start_probe_fits_any_vocabulary_and_any_length(cls, sep, pad, vocab, length):
    """The probe that start-up (and export's OpenVINO int8) runs: every id a real one that is
    not special, every sequence within the model's positions (CLIP's export failed on both)."""
    from service.engine.openvino_session import probe_of
    from service.manifest import SpecialTokens

    batch = probe_of(SpecialTokens(cls=cls, sep=sep, pad=pad), vocab, length)
    real = batch.attention_mask.astype(bool)
    ids = batch.input_ids[real]
    assert batch.input_ids.shape[1] <= length and (ids < vocab).all() and (ids >= 0).all()
    inner = batch.input_ids[:, 1:-1][real[:, 1:-1] & real[:, 2:]]  # not first, not last
    assert not set(inner.tolist()) & {t for t in (cls, sep, pad) if t is not None}
    assert len(set(real.sum(1).tolist())) > 1  # lengths differ: some rows padded


def test_a_server_on_two_openvino_streams_answers_many_clients_as_one_stream_does(default_bundle):
    """HEADWISE_OPENVINO_STREAMS=2: two batches computed at once (each on its own stream and
    thread); 24 requests sent together get the same vectors as on one stream, /info says how
    many streams serve, the memory bound counts a batch per stream, and no thread makes (and
    warms) its infer request while serving."""
    import concurrent.futures

    texts = [f"{t} ({k})" for k in range(4) for t in TEXTS]
    answers, batches = {}, {}
    for streams in (1, 2):
        with client_for(
            default_bundle, runtime="openvino", precision="fp32", openvino_streams=streams,
            max_batch_size=2, calibration_s=0.5,
        ) as c:  # fmt: skip
            info = c.get("/info").json()
            model = info["models"][0]
            assert (model["runtime"], model["streams"]) == ("openvino", streams)
            assert model["lone_compile"] is (streams > 1)
            batches[streams] = info["memory"]["encode_batches_bytes"]

            def one(text: str) -> list[float]:
                r = c.post("/encode", json={"inputs": [text]})
                assert r.status_code == 200, r.text
                return r.json()["embeddings"][0]

            session = c.app.state.registry.first.backend.session
            before = len(session._requests)  # one infer request a thread that ran it
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                answers[streams] = np.array(list(pool.map(one, texts)))
            # Every thread that serves had its request made and warmed before ready.
            assert len(session._requests) == before
    assert cosines(answers[2], answers[1]).min() > 0.99999
    assert batches[2] == 2 * batches[1]  # the memory bound holds two batches a batcher


def _two_texts(session: OpenVinoSession) -> dict[str, np.ndarray]:
    """Feeds of two texts, one padded, in the inputs the session's graph takes."""
    ids = np.array([[101, 7592, 2088, 102], [101, 7592, 102, 0]], np.int64)
    names = [i.name for i in session.get_inputs()]
    feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    return feeds


def test_a_session_of_two_streams_runs_two_threads_at_once_with_one_streams_vectors(tiny_bundle):
    """OpenVinoSession(streams=2) compiles two streams (the batcher then runs two batches at
    once, one per thread); runs from two threads together give one stream's vectors."""
    import concurrent.futures
    import threading

    session = OpenVinoSession(tiny_bundle / "encoder.onnx", streams=2)
    one = OpenVinoSession(tiny_bundle / "encoder.onnx")
    assert (session.streams, one.streams) == (2, 1)
    feeds = _two_texts(session)
    want = one.run(None, feeds)[0]
    together = threading.Barrier(2, timeout=30)  # each run starts with the other thread's

    def run(_: int) -> np.ndarray:
        together.wait()
        return session.run(None, feeds)[0]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(run, range(8)))
    assert len(session._requests) == 2  # one infer request a thread
    for out in got:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_run_alone_on_a_session_of_streams_takes_its_lone_compile_with_the_same_vectors(
    tiny_bundle,
):
    """With streams, a run marked alone (engine/alone.py: the batcher's batch with nothing
    beside it) goes to a second compile with every thread, on its own infer request; the same
    vectors. One stream has no second compile: alone or not, one request."""
    from service.engine.alone import alone

    session = OpenVinoSession(tiny_bundle / "encoder.onnx", streams=2)
    one = OpenVinoSession(tiny_bundle / "encoder.onnx")
    assert (session.lone, one.lone) == (True, False)
    assert int(session._lone.get_property("NUM_STREAMS")) == 1
    feeds = _two_texts(session)
    streamed = session.run(None, feeds)[0]
    with alone():
        lone = session.run(None, feeds)[0]
        one.run(None, feeds)
    assert len(session._requests) == 2 and session._local.lone is not session._local.request
    assert len(one._requests) == 1
    np.testing.assert_allclose(lone, streamed, rtol=1e-5, atol=1e-5)


def test_the_lone_compile_runs_the_shared_lengths_too(tiny_bundle):
    """Its shapes are prepared apart from the streams' compile: warm(shared=...) runs the
    longer lengths on a request of each."""
    from service.engine.alone import ALONE

    session = OpenVinoSession(tiny_bundle / "encoder.onnx", streams=2)
    runs: list[tuple[bool, int, int]] = []
    real = session._warm

    def spy(request, lengths=None):
        if lengths is not None:
            runs.append((ALONE.get(), lengths.start, lengths[-1]))
        real(request, lengths)

    session._warm = spy
    session.warm(3, shared=6)
    assert runs == [(False, 4, 6), (True, 4, 6)]
    assert len(session._requests) == 2  # the streams' request and the lone one


def test_streams_follow_the_cpus_the_process_may_use(tiny_bundle, monkeypatch):
    """HEADWISE_OPENVINO_STREAMS=0 (the default): one stream below 16 usable CPUs, two from 16
    (bench.streams: on 16 CPUs two gave 1.26x the texts/s at 1.05x one text's p50), and two
    from 2 on AMX (2 cores: 1.09-1.24x at 0.99x)."""
    from service import registry
    from service.engine.cpu import Cores, Cpu

    avx2 = Cpu("as the test says", frozenset({"avx2"}))
    amx = Cpu("as the test says", frozenset({"avx2", "amx_bf16"}))
    for usable, cpu, want in ((2, avx2, 1), (16, avx2, 2), (2, amx, 2)):
        monkeypatch.setattr(registry, "cores", lambda u=usable: Cores(u, u, "as the test says"))
        monkeypatch.setattr(registry, "detect", lambda c=cpu: c)
        with client_for(tiny_bundle, runtime="openvino", precision="fp32", calibration_s=0.5) as c:
            model = c.get("/info").json()["models"][0]
            assert (model["runtime"], model["streams"]) == ("openvino", want)
            assert c.post("/encode", json={"inputs": ["a", "b c"]}).status_code == 200


def test_info_says_how_openvino_pads_its_batches_and_the_setting_turns_it_off(tiny_bundle):
    """bf16: start-up's measurement and what it decided, its figures in /info; fp32 follows the
    tokens (bench/tiles.py), so nothing is measured; HEADWISE_OPENVINO_PADDING=false pads nothing;
    ONNX Runtime: no padding of this kind at all."""
    precision = "bf16" if detect().bf16 else "fp32"
    for padding, runtime in ((True, "openvino"), (False, "openvino"), (True, "onnxruntime")):
        asked = precision if runtime == "openvino" else "fp32"
        with client_for(
            tiny_bundle, runtime=runtime, precision=asked, openvino_padding=padding
        ) as c:
            model = c.get("/info").json()["models"][0]
            assert c.post("/encode", json={"inputs": ["a", "b c " * 20]}).status_code == 200
        said = model["padding"]
        if runtime == "onnxruntime":
            assert said is None
        elif not padding:
            assert "HEADWISE_OPENVINO_PADDING is off" in said["reason"]
            assert said["least_remainder_padded"] == {"batches": None, "one_text": None}
        elif precision == "bf16":
            assert said["tile"] == TILE and said["reason"].startswith("measured at start")
            assert {r: len(ms) for r, ms in said["measured_ms"].items()} == {"8": 16, "1": 16}
        else:
            assert "fp32 follows the tokens" in said["reason"] and not said["measured_ms"]


@pytest.mark.parametrize("broken", [False, True])
def test_start_checks_a_padded_batch_and_runs_at_its_own_length_where_it_disagrees(
    tiny_bundle, monkeypatch, broken
):
    """Start-up's probe runs again cut to a length the session pads: answers as ONNX Runtime's
    keep the padding; a padded run that answers otherwise (a graph that reads the padding) is
    served at every batch's own length, /info saying why, still on OpenVINO."""
    init, run = OpenVinoSession.__init__, OpenVinoSession.run

    def forced(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.padding = Padding(rows=1, row=1)  # fp32: pads where bf16's measurement would

    def reads_the_padding(self, names, feeds, run_options=None):
        out = run(self, names, feeds, run_options)
        if broken and self._padded(feeds)[0] is not feeds:
            return [v * 1.5 + 1 for v in out]
        return out

    monkeypatch.setattr(OpenVinoSession, "__init__", forced)
    monkeypatch.setattr(OpenVinoSession, "run", reads_the_padding)
    with client_for(tiny_bundle, runtime="openvino", precision="fp32") as c:
        model = c.get("/info").json()["models"][0]
        assert c.post("/encode", json={"inputs": ["a b c " * 7, "d"]}).status_code == 200
    assert model["runtime"] == "openvino"
    said = model["padding"]
    if broken:
        assert said["reason"].startswith("a batch padded to the tile disagrees")
        assert said["least_remainder_padded"] == {"batches": None, "one_text": None}
    else:
        assert said["least_remainder_padded"] == {"batches": 1, "one_text": 1}
