"""ONNX Runtime's transformer optimizer, plus the gate it lacks: fail when fusion fell short.

The optimizer only *warns* when its pattern matcher misses attention; a graph that silently
runs unfused is slower and, worse, not the graph we claim to ship. Here a short count is an
error that names what is missing.

Each family's attention is fused one of three ways (export/fused.py's `plan`): ORT's matcher
finds the BERT pattern ("match": a miss is an error, or with allow_unfused a bundle marked
unfused); export wrote ORT's MultiHeadAttention/RotaryEmbedding nodes itself ("emit": the gate
checks every one is there); or ORT has no kernel for it ("none": the unfused graph ships, and
the manifest says why).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export import external
from export.fused import Plan, expected_nodes
from models.config import EncoderConfig

log = logging.getLogger(__name__)

ATTENTION_OPS = ("Attention", "MultiHeadAttention")
REPORTED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
    "Softmax",
    "MatMul",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "QAttention",
)


class FusionError(RuntimeError):
    """The optimizer did not fuse the graph as required."""


@dataclass(frozen=True)
class FusionReport:
    op_counts: dict[str, int]
    attention_nodes: int
    softmax_nodes: int
    fused: bool = True
    unfused_reason: str | None = None  # why attention is not fused, when it is not

    def describe(self) -> str:
        """What the gate found fused, in one line (logged at export)."""
        if not self.fused:
            return f"UNFUSED ({self.unfused_reason}); ops {self.op_counts}"
        return f"{self.attention_nodes} fused attention node(s), 0 Softmax; ops {self.op_counts}"


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in REPORTED_OPS if counts[op]}


def check_fusion(model: onnx.ModelProto, n_layers: int) -> FusionReport:
    counts = Counter(node.op_type for node in model.graph.node)
    attention = sum(counts[op] for op in ATTENTION_OPS) + counts["QAttention"]
    softmax = counts["Softmax"]
    if attention < n_layers or softmax:
        raise FusionError(
            f"attention was not fused: {attention} fused attention node(s) for {n_layers} layers "
            f"and {softmax} Softmax node(s) left (need >= {n_layers} and 0). The exported graph "
            "does not have the shape ONNX Runtime's BERT fusion matches (additive "
            "(1 - mask) * -10000 mask, explicit softmax(QKᵀ/√d_k)·V)."
        )
    return FusionReport(op_counts(model), attention, softmax)


def check_emitted(
    model: onnx.ModelProto, cfg: EncoderConfig, attention: int | None = None
) -> FusionReport:
    """The nodes export wrote itself (export/fused.py) are all there after optimisation, and no
    Softmax is left: anything else is export's own bug, and an error naming the op."""
    counts = Counter(node.op_type for node in model.graph.node)
    for op, want in expected_nodes(cfg, attention).items():
        if counts[op] != want:
            raise FusionError(
                f"{cfg.architecture}: the serving graph has {counts[op]} {op} node(s), export "
                f"emitted {want} ({cfg.n_layers} layers): ONNX Runtime's optimizer or the "
                "export lost the fused attention"
            )
    return FusionReport(op_counts(model), counts["MultiHeadAttention"], 0)


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def detach_attention_bias(model: onnx.ModelProto) -> str:
    """Softmax(scores + mask + bias) -> Softmax(scores + mask); returns the bias tensor's name.

    ONNX Runtime's BERT fusion matches softmax(QKᵀ/√d_k + mask)·V; an extra score bias (MPNet's
    relative positions, one tensor shared by every layer) hides that pattern. Detached, the
    pattern fuses, and attach_attention_bias hands the bias to each fused node as its
    `attention_bias` input: the same sum, inside the kernel. Until then the bias is kept alive
    as an extra graph output.
    """
    producers = _producers(model)
    biases: set[str] = set()
    for softmax in (n for n in model.graph.node if n.op_type == "Softmax"):
        add = producers.get(softmax.input[0])
        inner = producers.get(add.input[0]) if add is not None else None
        if add is None or add.op_type != "Add" or inner is None or inner.op_type != "Add":
            raise FusionError(f"{softmax.name}: no (scores + mask) + bias before the Softmax")
        softmax.input[0] = add.input[0]
        biases.add(add.input[1])
        model.graph.node.remove(add)
    if len(biases) != 1:
        raise FusionError(f"expected one attention bias shared by all layers, found {len(biases)}")
    (bias,) = biases
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(bias, onnx.TensorProto.FLOAT, None)
    )
    return bias


def attach_attention_bias(model: onnx.ModelProto, bias: str) -> None:
    """Give every fused Attention node `bias` as input 5 (attention_bias, (1, h, N, N))."""
    for node in (n for n in model.graph.node if n.op_type == "Attention"):
        while len(node.input) < 5:  # input, weights, bias, mask_index, past
            node.input.append("")
        node.input.append(bias)
    (output,) = [o for o in model.graph.output if o.name == bias]
    model.graph.output.remove(output)


def fuse(
    raw: Path,
    out: Path,
    cfg: EncoderConfig,
    plan: Plan,
    allow_unfused: bool = False,
    attention: int | None = None,
) -> FusionReport:
    """Optimise `raw` into `out` and gate it by the family's plan (module docstring).

    "match": FusionError when attention did not fuse, unless allow_unfused (then `out` is the
    optimised but unfused graph, and the report says fused=False and why). "emit": FusionError
    unless every emitted node survived (`attention`: the attention modules export switched,
    when not one per layer). "none": the optimised unfused graph, with the plan's reason.
    """
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.onnx_model import OnnxModel
    from onnxruntime.transformers.optimizer import optimize_model

    raw, out = raw.resolve(), out.resolve()
    options = FusionOptions("bert")
    # The raw 2-D mask, not a 1-D "sequence length" index: the latter silently assumes right
    # padding, and a bundle is a public artefact that callers may feed left-padded batches.
    options.attention_mask_format = AttentionMaskFormat.AttentionMask

    def optimize(model: onnx.ModelProto) -> OnnxModel:
        # The weights stay on disk (lean): a fusion that reads one (q, k, v to pack) finds it
        # relative to the working directory, the raw graph's folder.
        with contextlib.chdir(raw.parent):
            return optimize_model(
                model,
                model_type="bert",
                num_heads=cfg.n_heads,
                hidden_size=cfg.d_model,
                optimization_options=options,
                opt_level=0,
                use_gpu=False,
            )

    def unfused(reason: str) -> tuple[OnnxModel, FusionReport]:
        optimized = optimize(external.load_lean(raw))
        counts = Counter(node.op_type for node in optimized.model.graph.node)
        report = FusionReport(
            op_counts(optimized.model),
            sum(counts[op] for op in ATTENTION_OPS),
            counts["Softmax"],
            fused=False,
            unfused_reason=reason,
        )
        return optimized, report

    if plan.kind == "none":
        log.warning("shipping an UNFUSED graph: %s", plan.reason)
        optimized, report = unfused(plan.reason or "no fused kernel")
    elif plan.kind == "emit":
        optimized = optimize(external.load_lean(raw))
        report = check_emitted(optimized.model, cfg, attention)
    else:
        try:
            model = external.load_lean(raw)
            bias = detach_attention_bias(model) if cfg.relative_attention_buckets > 0 else None
            optimized = optimize(model)
            if bias is not None:
                attach_attention_bias(optimized.model, bias)
            report = check_fusion(optimized.model, cfg.n_layers)
        except FusionError as exc:
            if not allow_unfused:
                raise
            log.warning("shipping an UNFUSED graph (allowed by flag): %s", exc)
            optimized, report = unfused(f"allowed by --allow-unfused: {exc}")
    optimized.topological_sort()
    external.save(optimized.model, out, raw.parent)
    log.info("%s %s: %s", cfg.architecture, out.name, report.describe())
    return report


def to_fp16(fused: Path, out: Path) -> dict[str, int]:
    """Half-precision weights and compute for the GPU; float32 inputs and outputs stay.

    Gemm stays float32 (2-D products only: classification heads, DeBERTa's projections of its
    relative-position table): ONNX Runtime 1.32's CPU session, at full optimisation, crashes
    (SIGSEGV) on a float16 Gemm of constants it cannot fold, and export runs the fp16 graph on
    the CPU for its parity gate.
    """
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(external.load(fused))
    model.convert_float_to_float16(
        keep_io_types=True, op_block_list=[*DEFAULT_OP_BLOCK_LIST, "Gemm"]
    )
    model.topological_sort()
    external.save(model.model, out)  # one file where it fits (a 0.6B model's 1.2 GB does)
    return op_counts(model.model)


@dataclass(frozen=True)
class Int8Report:
    op_counts: dict[str, int]
    kept_fp32: list[str]  # nodes left in float32 because quantising them failed the gate
    candidates: int  # MatMul/Attention nodes that could be quantised
    tried: int  # graphs quantised and scored to find this one

    @property
    def quantised(self) -> int:
        return self.candidates - len(self.kept_fp32)


def _quantize(
    fused: Path, out: Path, include: list[str] | None = None, exclude: list[str] | None = None
) -> None:
    """Per-channel int8 weights, activations quantised per run (dynamic, uint8): the U8S8 GEMM
    that ONNX Runtime's MLAS runs with the CPU's int8 dot-product instructions (AVX512-VNNI,
    AVX-VNNI) where CPUID shows them, and with AVX2 widening multiplies elsewhere."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # A graph with a data file beside it is past one protobuf: so will its int8 graph be (its
    # embedding tables stay float32).
    large = fused.with_name(fused.name + external.DATA_SUFFIX).exists()
    out.with_name(out.name + external.DATA_SUFFIX).unlink(missing_ok=True)  # else appended to
    quantize_dynamic(
        str(fused),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=True,
        # Embeddings stay float: a quantised word-embedding table hurts short texts most.
        op_types_to_quantize=["MatMul", "Attention"],
        nodes_to_quantize=include,
        nodes_to_exclude=exclude,
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        use_external_data_format=large,
    )


def quantisable(model: onnx.ModelProto) -> list[str]:
    """The MatMul and Attention nodes whose weight is a 2-D initializer: per-channel int8 has
    one scale per column of a matrix. (A product with a folded 3-D constant, DeBERTa's
    relative positions projected per head, is not a weight and stays float32.)"""
    dims = {t.name: len(t.dims) for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type in ("MatMul", "Attention") and dims.get(n.input[1]) == 2
    ]


def int8_probes(fused: Path, names: Sequence[str], probe: Path) -> Iterator[tuple[str, Path]]:
    """For each node in `names`: `probe` rewritten as `fused` with that node alone computing what
    `_quantize` makes of it, in float ops: its weight rounded to int8 per column (symmetric,
    [-127, 127], as per-channel QInt8), its input through DynamicQuantizeLinear and
    DequantizeLinear (uint8 per tensor, as the dynamic graph quantises activations). The int8
    products are exact in either form, so the outputs are the int8 graph's (all-MiniLM-L6-v2's
    24 nodes: the same cosine lost, to 5 digits). Without a `quantize_dynamic` a node (ONNX shape
    inference and the whole graph rewritten, ~1 s a node there): the weights are written once,
    to a data file beside `probe` (streamed from where they are), and each probe is the graph
    and one weight. Both files are removed at the end."""
    lean = external.load_lean(fused)
    data = probe.with_name(probe.name + external.DATA_SUFFIX)
    try:
        external.to_data_file(lean, data, fused.parent)  # the graph now points into `data`
        for name in names:
            m = onnx.ModelProto()
            m.CopyFrom(lean)
            node = next(n for n in m.graph.node if n.name == name)
            weight = next(t for t in m.graph.initializer if t.name == node.input[1])
            w = numpy_helper.to_array(weight, base_dir=str(probe.parent)).astype(np.float32)
            scale = np.abs(w).max(axis=0, keepdims=True) / 127.0
            scale[scale == 0] = 1.0
            rounded = np.clip(np.round(w / scale), -127, 127) * scale
            weight.CopyFrom(numpy_helper.from_array(rounded.astype(np.float32), weight.name))
            x = node.input[0]
            q, s, z, back = (f"{x}/{name}/int8_{k}" for k in ("q", "scale", "zero", "float"))
            at = list(m.graph.node).index(node)
            m.graph.node.insert(at, helper.make_node("DequantizeLinear", [q, s, z], [back]))
            m.graph.node.insert(at, helper.make_node("DynamicQuantizeLinear", [x], [q, s, z]))
            node.input[0] = back
            probe.write_bytes(m.SerializeToString())
            yield name, probe
    finally:
        probe.unlink(missing_ok=True)
        data.unlink(missing_ok=True)


def to_int8(
    fused: Path,
    out: Path,
    passes: Callable[[Path], bool],
    damage: Callable[[Path], float],
) -> Int8Report:
    """The fastest int8 graph that `passes` (export's gate: retrieval and similarity ranking
    against fp32 on real text), keeping the fewest nodes in float32.

    Every MatMul and Attention quantised is the fastest graph; it is tried first. When it fails,
    each node's own `damage` is measured (that node alone quantised, as `int8_probes` computes it;
    a cheap score, e.g. cosine lost on the probe texts), the nodes are ranked worst first, and a
    binary search finds the fewest worst nodes to keep in float32 for the graph to pass (keeping
    more never hurts, to the precision the gate can see). Every node kept: the fp32 graph's
    quality, and the gate has nothing left to trade.
    """
    candidates = quantisable(external.load_lean(fused))
    _quantize(fused, out, include=candidates)
    tried = 1
    if passes(out):
        return Int8Report(_counts(out), [], len(candidates), tried)
    probes = int8_probes(fused, candidates, out.with_suffix(".probe.onnx"))
    hurt = {name: damage(probe) for name, probe in probes}
    ranked = sorted(candidates, key=hurt.__getitem__, reverse=True)
    lo, hi = 1, len(ranked)  # fewest kept that may pass .. known to pass (all kept)
    while lo < hi:
        k = (lo + hi) // 2
        _quantize(fused, out, include=candidates, exclude=ranked[:k])
        tried += 1
        if passes(out):
            hi = k
        else:
            lo = k + 1
    kept = ranked[:hi]
    _quantize(fused, out, include=candidates, exclude=kept)
    log.info("int8: kept %d of %d nodes in fp32 (%d graphs scored)", len(kept), len(ranked), tried)
    return Int8Report(_counts(out), kept, len(candidates), tried)


def _counts(path: Path) -> dict[str, int]:
    return op_counts(onnx.load(str(path), load_external_data=False))
