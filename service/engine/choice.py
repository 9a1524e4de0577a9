"""Which runtime and precision serve a model's graph on this machine, and why (/info says it).

By default the fastest path whose embeddings stay with fp32's: OpenVINO in bf16 on a CPU with
bf16 units (`amx_bf16`, `avx512_bf16`), where it ran 3-4x ONNX Runtime's fp32 at equal retrieval;
ONNX Runtime elsewhere (on an AVX2-only CPU OpenVINO's fp32 ran 0.9-1.1x ONNX Runtime's: nothing
to gain), and always on a GPU. What the machine cannot do is refused at start with the reason,
even when asked for: bf16 on a CPU without bf16 units would compute fp32 (OpenVINO compiles fp32
there). What one model's graph cannot do on OpenVINO (an op it cannot compile, outputs that
disagree with ONNX Runtime's on a probe batch) serves that model on ONNX Runtime instead, and
/info and the log say why (service/engine/runtime.py). int8 is never chosen by itself: ONNX
Runtime's (`HEADWISE_PRECISION=int8`) or OpenVINO's own NNCF graph (with
`HEADWISE_RUNTIME=openvino`), each judged by the retrieval gate, is the operator's choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.engine.cpu import Cpu
from service.settings import Settings

Runtime = Literal["onnxruntime", "openvino"]


class Unservable(RuntimeError):
    """The runtime or precision asked for cannot be served here (the message says why)."""


@dataclass(frozen=True)
class Choice:
    runtime: Runtime
    precision: str  # what the settings leave to the runtime: auto, fp32, fp16, int8, bf16
    reason: str


def choose(settings: Settings, cpu: Cpu, on_cuda: bool, openvino: str | None) -> Choice:
    """openvino: OpenVINO's version when it is installed, else None."""
    runtime, precision = settings.runtime, settings.precision
    bf16 = cpu.bf16
    flags = f"this CPU's flags: {cpu.describe()}"
    if runtime == "openvino" or precision == "bf16":
        if on_cuda and settings.device == "cuda":
            raise Unservable(
                "OpenVINO (and bf16) serve on the CPU here; HEADWISE_DEVICE=cuda needs "
                "HEADWISE_RUNTIME=onnxruntime (or auto) and fp32/fp16/int8"
            )
        if openvino is None:
            raise Unservable(
                "HEADWISE_RUNTIME=openvino or HEADWISE_PRECISION=bf16 needs OpenVINO: "
                "pip install openvino (the headwise[cpu] extra carries it)"
            )
        if runtime == "onnxruntime":
            raise Unservable(
                "bf16 runs on OpenVINO: set HEADWISE_RUNTIME=openvino (or auto), or a precision "
                "ONNX Runtime serves (fp32, int8)"
            )
        if precision == "bf16" and not bf16:
            raise Unservable(
                f"bf16 needs a CPU with bf16 units (amx_bf16 or avx512_bf16); {flags}: OpenVINO "
                "would compute fp32 here. Serve fp32 (HEADWISE_PRECISION=auto or fp32)"
            )
        if precision == "fp16":
            raise Unservable(
                "OpenVINO serves fp32, bf16 and int8 here; fp16 is ONNX Runtime's GPU graph: "
                "HEADWISE_RUNTIME=onnxruntime (or auto)"
            )
        if precision == "int8":  # the operator's choice, judged by the retrieval gate at start
            return Choice(
                "openvino",
                "int8",
                f"HEADWISE_RUNTIME=openvino, HEADWISE_PRECISION=int8; {flags}; OpenVINO "
                f"{openvino} on the bundle's NNCF int8 graph",
            )
        served = "bf16" if precision == "bf16" or (precision == "auto" and bf16) else "fp32"
        asked = "HEADWISE_PRECISION=bf16" if precision == "bf16" else "HEADWISE_RUNTIME=openvino"
        return Choice("openvino", served, f"{asked}; {flags}; OpenVINO {openvino}")
    if runtime == "onnxruntime":
        return Choice("onnxruntime", precision, "HEADWISE_RUNTIME=onnxruntime")
    # auto
    if on_cuda:
        return Choice("onnxruntime", precision, "a GPU: ONNX Runtime's CUDA provider")
    if precision != "auto":
        return Choice("onnxruntime", precision, f"HEADWISE_PRECISION={precision}: ONNX Runtime")
    if not bf16:
        return Choice("onnxruntime", "auto", f"{flags} (no bf16 units): ONNX Runtime fp32")
    if openvino is None:
        return Choice(
            "onnxruntime",
            "auto",
            f"{flags}, but OpenVINO is not installed (pip install openvino): ONNX Runtime fp32",
        )
    return Choice("openvino", "bf16", f"{flags}: OpenVINO {openvino} bf16 on its matrix units")
