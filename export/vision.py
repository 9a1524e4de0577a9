"""An image-text bundle's vision tower: its serving graph (attention fused), its attention graph
(every layer's maps, SigLIP's pooling probe, head gates) and its fp16 graph, each checked
against PyTorch on probe images that the service's own code prepares (service/images), as
text probes are tokenised by the bundle's tokenizer.

    encoder.vision.onnx    pixel_values (B, C, H, W) -> image_embeds (B, dim)
    attention.vision.onnx  pixel_values, head_gates (B, L, h) -> image_embeds, attentions
                           (L, B, h, N, N)[, pool_attentions (B, h, 1, N): SigLIP's probe]
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from PIL import Image
from torch import Tensor, nn

from export import external, fused, optimize, shapes, verify
from export.entries import graph_entry
from export.onnx import HEAD_GATES, default_gates, trace
from models.image_text import ImageTextModel
from models.vision import VisionConfig, VisionEncoder
from service.bundle import sha256_file
from service.engine import quality
from service.images.preprocessing import ImagePreprocessing, preprocess
from service.manifest import GraphEntry, GraphKey, Parity, RetrievalQuality, VisionTower, ZeroShot

log = logging.getLogger(__name__)

PIXELS = "pixel_values"
IMAGE_EMBEDS = "image_embeds"
ATTENTIONS = "attentions"
POOL_ATTENTIONS = "pool_attentions"
SERVING = "encoder.vision.onnx"
ATTENTION = "attention.vision.onnx"
FP16 = "encoder.vision.fp16.onnx"
INT8 = "encoder.vision.int8.onnx"


class VisionServing(nn.Module):
    def __init__(self, vision: VisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.vision.run(pixel_values).pooled  # (B, dim)


class VisionAttention(nn.Module):
    """pixels, gates -> image vector, every layer's maps (and MAP's probe map)."""

    def __init__(self, vision: VisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_values: Tensor, head_gates: Tensor | None = None) -> tuple[Tensor, ...]:
        out = self.vision.run(pixel_values, need_weights=True, head_gates=head_gates)
        assert out.attentions is not None
        maps = torch.stack(out.attentions)  # (L, B, h, N, N)
        if out.pool_weights is None:
            return out.pooled, maps
        return out.pooled, maps, out.pool_weights  # (B, h, 1, N)


def probe_images(p: ImagePreprocessing, count: int = 6) -> np.ndarray:
    """Synthetic pictures of several sizes and shapes (noise, gradients, a disc), prepared as
    the service prepares a request's: (count, C, H, W) float32."""
    rng = np.random.default_rng(0)
    sizes = [(224, 224), (301, 197), (97, 413), (640, 480), (33, 47), (512, 256)]
    out = []
    for i in range(count):
        w, h = sizes[i % len(sizes)]
        if i % 3 == 0:
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        else:
            y, x = np.mgrid[0:h, 0:w]
            r = np.hypot(x - w / 2, y - h / 2) < min(h, w) / (3 + i % 2)
            pixels = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), r * 255], -1)
        out.append(preprocess(Image.fromarray(pixels.astype(np.uint8), "RGB"), p))
    return np.stack(out).astype(np.float32)


def _torch(
    vision: VisionEncoder, pixels: np.ndarray, gates: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """PyTorch's image vectors, and (ungated) every layer's maps and MAP's probe map."""
    with torch.no_grad():
        out = vision.run(
            torch.from_numpy(pixels),
            need_weights=gates is None,
            head_gates=None if gates is None else torch.from_numpy(gates),
        )
    maps = None if out.attentions is None else torch.stack(out.attentions).numpy()
    probe = None if out.pool_weights is None else out.pool_weights.numpy()
    return out.pooled.numpy(), maps, probe


def _require(got: np.ndarray, want: np.ndarray, graph: str, min_cosine: float) -> Parity:
    parity = verify.compare("pytorch", got, want)
    verify.require(parity, graph, min_cosine)
    return parity


@dataclass(frozen=True)
class VisionExport:
    fp16: bool = False
    allow_unfused: bool = False
    # int8, gated as the text's: image -> caption retrieval of the int8 tower within
    # `int8_max_drop` points of recall@10 and MRR of the fp32 tower's, on `int8_images` captioned
    # pictures (export/shapes.py), the captions embedded once by the fp32 text tower.
    int8: bool = False
    int8_images: int = 400
    int8_max_drop: float = quality.MAX_DROP_POINTS
    int8_min_spearman: float = quality.MIN_SPEARMAN


Captions = Callable[[list[str]], np.ndarray]  # texts -> the fp32 text tower's vectors


def _images(path: Path, pixels: np.ndarray, rows: int = 32) -> np.ndarray:
    """A vision graph's image vectors, `rows` pictures a run."""
    session = verify.checking_session(path)
    parts = [session.run(None, {PIXELS: pixels[i : i + rows]})[0] for i in range(0, len(pixels), rows)]
    return np.concatenate(parts)


def vision_int8(
    serving: Path,
    out: Path,
    preprocessing: ImagePreprocessing,
    captions: Captions,
    probes: np.ndarray,
    want: np.ndarray,
    options: VisionExport,
) -> GraphEntry:
    """The fastest int8 vision graph whose image -> caption retrieval keeps the fp32 graph's
    (optimize.to_int8's search), with what the gate measured."""
    shown = shapes.captioned(options.int8_images)
    gated = bool(shown)  # 0 images: held to the probes' cosine alone
    pixels = np.stack([preprocess(c.image, preprocessing) for c in shown]) if gated else probes
    texts = captions([c.caption for c in shown]) if gated else want
    fp32 = (_images(serving, pixels.astype(np.float32)), texts)
    measured: dict[str, RetrievalQuality] = {}

    def measure(candidate: Path) -> RetrievalQuality:
        key = sha256_file(candidate)
        if key not in measured:
            got = _images(candidate, pixels.astype(np.float32))
            q = quality.measure(fp32, (got, texts), shapes.CORPUS)
            measured[key] = q.model_copy(
                update={
                    "max_drop_allowed": options.int8_max_drop,
                    "min_spearman_allowed": options.int8_min_spearman,
                }
            )
        return measured[key]

    def passes(candidate: Path) -> bool:
        if verify.compare("pytorch", _images(candidate, probes), want).min_cosine < verify.INT8_MIN_COSINE:
            return False
        if not gated:
            return True
        q = measure(candidate)
        ok = quality.within(q, options.int8_max_drop, options.int8_min_spearman)
        log.info("vision int8 gate %s: %s", "passed" if ok else "failed", quality.summary(q))
        return ok

    def damage(candidate: Path) -> float:
        return 1.0 - verify.compare("pytorch", _images(candidate, probes), want).min_cosine

    q8 = optimize.to_int8(serving, out, passes, damage)
    parity = _require(_images(out, probes), want, out.name, verify.INT8_MIN_COSINE)
    return graph_entry(
        out, "int8", q8.op_counts, parity,
        kept_fp32=q8.kept_fp32, quantised=q8.quantised, quality=measure(out) if gated else None,
    )  # fmt: skip


def build_vision(
    model: ImageTextModel,
    preprocessing: ImagePreprocessing,
    tmp: Path,
    options: VisionExport,
    captions: Captions | None = None,
) -> VisionTower:
    """The vision tower's graphs written into the bundle folder `tmp`, checked; its manifest."""
    vision, v = model.vision, model.config.vision
    stack = v.stack
    size = preprocessing.output_size
    if size != (v.image_size, v.image_size):
        raise ValueError(
            f"preprocessor_config.json makes {size} images; the vision tower takes "
            f"{v.image_size} x {v.image_size}"
        )
    pixels = probe_images(preprocessing)
    want, want_maps, want_probe = _torch(vision, pixels)
    gates = verify.probe_gates(len(pixels), stack.n_layers, stack.n_heads)
    want_gated, _, _ = _torch(vision, pixels, gates)
    graphs: dict[GraphKey, GraphEntry] = {}
    sample = (torch.zeros(2, v.channels, v.image_size, v.image_size),)
    image_axes = {PIXELS: {0: "batch"}, IMAGE_EMBEDS: {0: "batch"}}

    raw = tmp / "raw-vision" / SERVING
    raw.parent.mkdir()
    with fused.ort_kernels(vision) as switched:
        trace(VisionServing(vision), raw, sample, [PIXELS], [IMAGE_EMBEDS], image_axes)
    serving = tmp / SERVING
    report = optimize.fuse(
        raw, serving, stack, fused.plan(stack), options.allow_unfused, attention=switched
    )
    shutil.rmtree(raw.parent)
    got = verify.checking_session(serving).run(None, {PIXELS: pixels})[0]
    parity = _require(got, want, SERVING, verify.FP32_MIN_COSINE)
    graphs["encoder"] = graph_entry(
        serving, "fp32", report.op_counts, parity,
        fused=report.fused, unfused_reason=report.unfused_reason,
    )  # fmt: skip

    raw = tmp / "raw-vision-attention" / ATTENTION
    raw.parent.mkdir()
    outputs = [IMAGE_EMBEDS, ATTENTIONS] + ([POOL_ATTENTIONS] if v.pooling == "map" else [])
    axes = {
        **image_axes,
        HEAD_GATES: {0: "gate_rows"},
        ATTENTIONS: {1: "batch"},
        POOL_ATTENTIONS: {0: "batch"},
    }
    gate_sample = {HEAD_GATES: torch.ones(2, stack.n_layers, stack.n_heads)}
    trace(VisionAttention(vision), raw, (*sample, gate_sample), [PIXELS, HEAD_GATES], outputs, axes)
    attention = tmp / ATTENTION
    external.rewrite(raw, attention)
    shutil.rmtree(raw.parent)
    default_gates(attention, stack.n_layers, stack.n_heads)
    session = verify.checking_session(attention)
    got_all = session.run(None, {PIXELS: pixels})
    parity = _require(got_all[0], want, ATTENTION, verify.FP32_MIN_COSINE)
    diff = float(np.abs(got_all[1] - want_maps).max())
    if want_probe is not None:
        diff = max(diff, float(np.abs(got_all[2] - want_probe).max()))
    if not diff <= verify.ATTENTION_MAX_ABS:
        raise verify.ParityError(f"{ATTENTION}: attention maps differ by {diff:.3g}")
    got_gated = session.run([IMAGE_EMBEDS], {PIXELS: pixels, HEAD_GATES: gates})[0]
    gated = _require(got_gated, want_gated, f"{ATTENTION} gated", verify.FP32_MIN_COSINE)
    del session
    counts = optimize.op_counts(onnx.load(str(attention), load_external_data=False))
    graphs["attention"] = graph_entry(
        attention, "fp32", counts, parity.model_copy(update={"attention_max_abs_diff": diff}),
        gated_parity=gated,
    )  # fmt: skip

    if options.fp16:
        path = tmp / FP16
        counts = optimize.to_fp16(serving, path)
        got = verify.checking_session(path).run(None, {PIXELS: pixels})[0]
        parity = _require(got, want, FP16, verify.FP16_MIN_COSINE)
        graphs["encoder_fp16"] = graph_entry(
            path, "fp16", counts, parity, fused=report.fused, unfused_reason=report.unfused_reason
        )
    if options.int8:
        if captions is None:
            raise ValueError("the vision tower's int8 gate needs the text tower's captions")
        entry = vision_int8(serving, tmp / INT8, preprocessing, captions, pixels, want, options)
        graphs["encoder_int8"] = entry.model_copy(
            update={"fused": report.fused, "unfused_reason": report.unfused_reason}
        )
    return _tower(v, model.config.kind, graphs, preprocessing, len(pixels))


def _tower(
    v: VisionConfig,
    kind: str,
    graphs: dict[GraphKey, GraphEntry],
    preprocessing: ImagePreprocessing,
    probes: int,
) -> VisionTower:
    stack = v.stack
    return VisionTower(
        architecture=kind,
        num_layers=stack.n_layers,
        num_heads=stack.n_heads,
        d_model=stack.d_model,
        d_ff=stack.d_ff,
        image_size=v.image_size,
        patch_size=v.patch_size,
        channels=v.channels,
        class_token=v.class_token,
        pooling=v.pooling,
        graphs=graphs,
        preprocessing=preprocessing,
        probe_images=probes,
    )


def zero_shot(model: ImageTextModel, template: str | None = None) -> ZeroShot:
    """The model's logit scale and bias, and how its probabilities are taken."""
    bias = model.logit_bias
    values = {
        "probabilities": model.config.probabilities,
        "scale": float(model.logit_scale.detach().float().exp().item()),
        "bias": float(bias.detach().float().item()) if bias is not None else 0.0,
    }
    return ZeroShot(**values, **({"template": template} if template else {}))
