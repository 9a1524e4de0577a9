"""Which runtime and precision serve, per CPU kind (service/engine/choice.py, cpu.py): OpenVINO
bf16 by default where the CPU has bf16 units, ONNX Runtime fp32 elsewhere and on a GPU; what the
machine cannot do is refused naming its flags; a backend whose OpenVINO graph cannot be what was
chosen is served on ONNX Runtime with the reason in /info."""

from __future__ import annotations

import numpy as np
import pytest

from service.bundle import load_bundle
from service.engine import quality
from service.engine import runtime as runtime_module
from service.engine.choice import Unservable, choose
from service.engine.cpu import Cpu, detect, parse
from service.engine.openvino_session import OpenVinoSession
from service.engine.runtime import DeviceUnavailable, OnnxBackend
from service.settings import Settings
from tests.service.conftest import client_for

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2
"""
AVX2 = Cpu("AMD EPYC", frozenset({"sse2", "avx2", "fma"}))
ZEN4 = Cpu("AMD EPYC 9R14", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}))
AMX = parse(CPUINFO)
OV = "2026.4.1"


def test_cpuinfo_gives_the_first_processors_model_and_flags():
    assert AMX.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert AMX.bf16 and ZEN4.bf16 and not AVX2.bf16
    assert AMX.shown == ["amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2"]
    assert parse("").model == "unknown" and not parse("").flags


@pytest.mark.parametrize(
    ("cpu", "runtime", "precision"),
    [(AVX2, "onnxruntime", "auto"), (ZEN4, "openvino", "bf16"), (AMX, "openvino", "bf16")],
)
def test_auto_picks_openvino_bf16_only_where_the_cpu_has_bf16_units(cpu, runtime, precision):
    c = choose(Settings(runtime="auto"), cpu, on_cuda=False, openvino=OV)
    assert (c.runtime, c.precision) == (runtime, precision)
    assert cpu.describe() in c.reason


def test_auto_stays_on_onnx_runtime_on_a_gpu_without_openvino_or_when_a_precision_is_named():
    assert choose(Settings(runtime="auto"), AMX, on_cuda=True, openvino=OV).runtime == "onnxruntime"
    missing = choose(Settings(runtime="auto"), AMX, on_cuda=False, openvino=None)
    assert missing.runtime == "onnxruntime" and "not installed" in missing.reason
    int8 = choose(Settings(runtime="auto", precision="int8"), AMX, on_cuda=False, openvino=OV)
    assert (int8.runtime, int8.precision) == ("onnxruntime", "int8")
    fp32 = choose(Settings(runtime="auto", precision="fp32"), AMX, on_cuda=False, openvino=OV)
    assert fp32.runtime == "onnxruntime"


def test_explicit_choices_are_served_as_asked():
    assert choose(Settings(runtime="openvino"), AVX2, False, OV).precision == "fp32"
    assert choose(Settings(runtime="openvino"), AMX, False, OV).precision == "bf16"
    assert choose(Settings(runtime="openvino", precision="fp32"), AMX, False, OV).precision == "fp32"
    assert choose(Settings(runtime="auto", precision="bf16"), ZEN4, False, OV).runtime == "openvino"
    assert choose(Settings(runtime="onnxruntime"), AMX, False, OV).runtime == "onnxruntime"
    # int8 on OpenVINO: the operator's choice (never auto), on any CPU, judged at start.
    int8 = choose(Settings(runtime="openvino", precision="int8"), AVX2, False, OV)
    assert (int8.runtime, int8.precision) == ("openvino", "int8") and "NNCF" in int8.reason


@pytest.mark.parametrize(
    ("settings", "cpu", "openvino", "says"),
    [
        (Settings(runtime="auto", precision="bf16"), AVX2, OV, "this CPU's flags: avx2"),
        (Settings(precision="bf16", runtime="onnxruntime"), AMX, OV, "bf16 runs on OpenVINO"),
        (Settings(runtime="openvino"), AMX, None, "pip install openvino"),
        (Settings(runtime="openvino", precision="fp16"), AMX, OV, "fp16 is ONNX Runtime's"),
        (Settings(runtime="openvino", device="cuda"), AMX, OV, "HEADWISE_DEVICE=cuda"),
    ],
)
def test_what_the_machine_cannot_do_is_refused_saying_why(settings, cpu, openvino, says):
    with pytest.raises(Unservable, match=says):
        choose(settings, cpu, on_cuda=settings.device == "cuda", openvino=openvino)


def test_a_bf16_choice_openvino_compiles_in_fp32_is_served_on_onnx_runtime_saying_so(
    tiny_bundle, monkeypatch
):
    """Flags that claim bf16 units (here: faked) while OpenVINO compiles fp32 (this CPU has
    none): the model is served on ONNX Runtime fp32, and /info says what happened."""
    if detect().bf16:
        pytest.skip("this CPU has bf16 units: OpenVINO compiles bf16 here")
    monkeypatch.setattr(runtime_module, "detect", lambda: AMX)
    with client_for(tiny_bundle, runtime="auto", calibration_s=0.5) as c:
        info = c.get("/info").json()
        assert info["runtime"] == "onnxruntime" and info["precision"] == "fp32"
        assert "compiled encoder.onnx in fp32, not bf16" in info["runtime_reason"]
        assert c.post("/encode", json={"inputs": "the cat"}).status_code == 200


def test_a_refused_bf16_stops_the_start_naming_the_flags(tiny_bundle):
    if detect().bf16:
        pytest.skip("this CPU has bf16 units: bf16 is served here")
    with pytest.raises(DeviceUnavailable, match="bf16 needs a CPU with bf16 units"):
        OnnxBackend(load_bundle(tiny_bundle), Settings(runtime="auto", precision="bf16"))


# --- the retrieval gate a precision below fp32 passes before it is served --------------------


class Blurred(OpenVinoSession):
    """OpenVINO's fp32 graph posing as bf16 that loses retrieval: its vectors blurred."""

    def __init__(self, path, precision="fp32", threads=0, streams=1, **kwargs):
        super().__init__(path, "fp32", threads, streams, **kwargs)
        self.precision = precision

    def run(self, names, feeds, run_options=None):
        out = super().run(names, feeds, run_options)
        rng = np.random.default_rng(len(feeds["input_ids"]))
        return [v + rng.normal(0, 2 * float(np.abs(v).mean()), v.shape).astype(v.dtype) for v in out]


@pytest.fixture
def blurred_bf16(monkeypatch):
    """A CPU that claims bf16 units, and a bf16 'compile' that agrees with ONNX Runtime on the
    probe but loses retrieval on real text."""
    monkeypatch.setattr(runtime_module, "detect", lambda: AMX)
    monkeypatch.setattr(runtime_module, "OpenVinoSession", Blurred)
    monkeypatch.setattr(runtime_module.openvino_session, "disagreement", lambda *a: None)


def test_a_precision_that_loses_retrieval_is_not_served_auto_falls_back_with_the_figures(
    default_bundle, blurred_bf16
):
    backend = OnnxBackend(
        load_bundle(default_bundle), Settings(runtime="openvino", precision_gate_pairs=100)
    )
    info = backend.info
    assert (info.runtime, info.precision) == ("onnxruntime", "fp32")
    assert "bf16 fails the retrieval gate (recall@1" in info.reason and "on 100 pairs" in info.reason
    q = backend.quality
    assert q is not None and q.max_drop > 0.5 and q.pairs == 100


def test_a_precision_asked_for_that_loses_retrieval_stops_the_start_with_the_figures(
    default_bundle, blurred_bf16
):
    with pytest.raises(DeviceUnavailable, match="bf16 fails the retrieval gate .*MRR"):
        OnnxBackend(
            load_bundle(default_bundle),
            Settings(runtime="auto", precision="bf16", precision_gate_pairs=100),
        )


def test_the_gate_passes_what_keeps_retrieval(default_bundle):
    """The same graph judged against itself loses nothing: the gate's figures are its own."""
    backend = OnnxBackend(load_bundle(default_bundle), Settings(runtime="onnxruntime"))
    pairs = quality.docstring_pairs("gate", limit=100)

    def run(feeds):
        return backend.session.run(["sentence_embedding"], feeds)[0]

    q = quality.judge(run, run, backend.tokenizer, ["input_ids", "attention_mask"], pairs)
    assert q.max_drop == 0 and q.spearman > 0.9999 and q.fp32_recall_at_10 > 30
    assert quality.within(q, quality.MAX_DROP_POINTS, quality.MIN_SPEARMAN)
