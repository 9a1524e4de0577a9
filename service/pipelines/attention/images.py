"""What a vision tower's heads look at: /attention on an image.

A ViT's tokens are patches (and CLIP's class token first), numbered row by row over the grid
the image was cut into. The answer is /attention's for text with patches for tokens, plus what
the viewer needs to lay the maps over the picture: the picture as the model saw it (resized and
cropped, before normalisation, as a PNG), the grid, and where each token sits on it.

Importance of each patch for the image's vector:
- CLIP: the class token's attention in the last layer (mean over heads), and attention rollout
  (Abnar & Zuidema 2020) from the class token;
- SigLIP, which has no class token and pools with an attention probe: the probe's map (mean over
  heads) is "cls_last_layer"'s counterpart, and rollout is the probe's map carried back through
  every layer's rollout (probe · joint).

It runs on the attention graph of the vision tower, one image at a time, on its own batcher,
under /attention's budget and CPU share (the same Budget and Pacer as text).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.engine.admission import Admission
from service.engine.batcher import DynamicBatcher
from service.engine.cost import CostModel
from service.engine.runtime import Backend
from service.images import ImagePreprocessing
from service.metrics import Metrics
from service.pipelines.attention import analysis
from service.pipelines.attention.encoding import MapEncoding, encode_maps, with_maps
from service.pipelines.attention.heatmap import encode_png, grid_image
from service.pipelines.attention.limits import Budget, Pacer, one_call_at_a_time
from service.pipelines.base import Intake, Prepared, Ran
from service.pipelines.call import Call
from service.settings import Settings
from service.tensors import Batch, l2_normalize

Pixels = Callable[[list[str]], Awaitable[list[np.ndarray]]]


@dataclass(frozen=True)
class ImageQuery:
    image: str  # a reference: data URI, base64 or an allowed URL
    layers: list[int]
    heads: list[int]
    format: Literal["json", "png"]
    encoding: MapEncoding = "float"


def picture(pixels: np.ndarray, p: ImagePreprocessing) -> str:
    """The model's input (C, H, W) back to the picture it was made from (resized and cropped,
    its normalisation and rescaling undone), as a PNG data URI: what the maps lie over."""
    rgb = pixels.transpose(1, 2, 0).astype(np.float64)  # (H, W, C)
    if p.do_normalize:
        rgb = rgb * np.asarray(p.image_std) + np.asarray(p.image_mean)
    if p.do_rescale:
        rgb = rgb / p.rescale_factor
    png = encode_png(np.clip(np.rint(rgb), 0, 255).astype(np.uint8))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def token_names(grid: int, class_token: bool) -> list[str]:
    """Each token's place: "[CLS]", then "r{row}c{col}" patch by patch, row by row."""
    patches = [f"r{r}c{c}" for r in range(grid) for c in range(grid)]
    return ["[CLS]", *patches] if class_token else patches


class ImageAttention:
    def __init__(
        self,
        name: str,
        backend: Backend,
        settings: Settings,
        metrics: Metrics,
        admission: Admission,
        budget: Budget,
        pacer: Pacer,
        pixels: Pixels,
        cost: CostModel | None = None,
    ) -> None:
        vision = backend.manifest.vision
        assert vision is not None
        self.name = name
        self.backend = backend
        self.vision = vision
        self.settings = settings
        self.budget, self.pacer, self.pixels = budget, pacer, pixels
        tokens = max(settings.attention_max_tokens, vision.tokens)
        policy = one_call_at_a_time(tokens, settings.attention_queue)
        self.batcher = DynamicBatcher(
            self._infer,
            policy,
            metrics.observer("attention_images", name),
            f"attention-images-{name}",
            0,
            cost=cost,
            device=admission.device,
        )
        admission.batchers.append(self.batcher)
        self.intake = Intake(self.batcher, admission, metrics, "attention_images", name)

    @property
    def numbers(self) -> int:
        """What the graph computes for one image: every layer's and head's N x N map."""
        v = self.vision
        return v.num_layers * v.num_heads * v.tokens**2

    def _infer(self, batch: Batch) -> list[list[np.ndarray]]:
        outs = self.backend.attend_images(batch)  # embeds (B, d), maps (L, B, h, N, N)[, probe]
        rows = []
        for i in range(len(batch)):
            row = [outs[0][i], outs[1][:, i]]
            if len(outs) > 2:
                row.append(outs[2][i, :, 0])  # (h, N): the probe's map
            rows.append(row)
        return rows

    @contextlib.asynccontextmanager
    async def _hold(self, prepared: Prepared) -> AsyncIterator[None]:
        async with (
            self.budget.hold(self.numbers, retry_after=self.pacer.wait_s + 1),
            self.pacer.turn(),
        ):
            yield

    async def run(self, call: Call, q: ImageQuery) -> tuple[list[bytes], str, Ran[list[np.ndarray]]]:
        tokens = self.vision.tokens

        async def prepare() -> Prepared:
            (pixels,) = await self.pixels([q.image])
            return Prepared([[0] * tokens], pixels=[pixels])

        async def render(ran: Ran[list[np.ndarray]]) -> tuple[list[bytes], str, Ran[list[np.ndarray]]]:
            (row,) = ran.rows
            pixels = ran.prepared.pixels[0] if ran.prepared.pixels else None
            body, media = await call.offload(self._render, q, row, pixels)
            return body, media, ran

        result: tuple[list[bytes], str, Ran[list[np.ndarray]]] = await self.intake.run(
            call, prepare, at_least=[tokens], hold=self._hold, then=render, unit="images"
        )
        return result

    async def rollout(self, call: Call, pixels: np.ndarray) -> np.ndarray:
        """Rollout from the pooling token over an already prepared image -> (N,), under
        /attention's budget and CPU share (/explain's attention beside its occlusion)."""
        tokens = self.vision.tokens

        async def ready() -> Prepared:
            return Prepared([[0] * tokens], pixels=[pixels])

        async def carried(ran: Ran[list[np.ndarray]]) -> np.ndarray:
            (row,) = ran.rows
            probe = row[2] if len(row) > 2 else None
            return np.asarray(self.importance(row[1], probe)["rollout"])

        out: np.ndarray = await self.intake.run(
            call, ready, at_least=[tokens], hold=self._hold, then=carried, unit="images"
        )
        return out

    def importance(self, maps: np.ndarray, probe: np.ndarray | None) -> dict[str, list[float]]:
        """Each token's share of the image vector: the pooling token's last-layer attention
        (CLIP's class token, SigLIP's probe) and rollout from it."""
        if probe is None:
            return {
                "cls_last_layer": analysis.cls_importance(maps, 0).tolist(),
                "rollout": analysis.rollout(maps, 0).tolist(),
            }
        pooled = probe.mean(0)  # (N,): the probe over the tokens, heads averaged
        joint = analysis.rollout_matrix(maps)
        carried = pooled @ joint
        return {"cls_last_layer": pooled.tolist(), "rollout": (carried / carried.sum()).tolist()}

    def _render(
        self, q: ImageQuery, row: list[np.ndarray], pixels: np.ndarray | None
    ) -> tuple[list[bytes], str]:
        embedding, maps = row[0], row[1]  # (d,), (L, h, N, N)
        probe = row[2] if len(row) > 2 else None  # (h, N)
        selected = maps[np.ix_(q.layers, q.heads)]
        if q.format == "png":
            return [encode_png(grid_image(selected))], "image/png"
        v = self.vision
        cls_index = 0 if v.class_token else None
        stats = analysis.head_stats(selected, cls_index, None)
        stats_rows = [
            {"layer": layer, "head": head, **{k: float(s[li, hi]) for k, s in stats.items()}}
            for li, layer in enumerate(q.layers)
            for hi, head in enumerate(q.heads)
        ]
        payload = {
            "model": self.name,
            "modality": "image",
            "tokens": token_names(v.grid, v.class_token),
            "grid": v.grid,
            "patch_size": v.patch_size,
            "image_size": v.image_size,
            "picture": picture(pixels, v.preprocessing) if pixels is not None else None,
            "truncated": False,
            "layers": q.layers,
            "heads": q.heads,
            "stats": stats_rows,
            "importance": self.importance(maps, probe),
            "pool_attention": probe.tolist() if probe is not None else None,
            "embedding": l2_normalize(embedding[None, :].astype(np.float32))[0],
        }
        return with_maps(payload, "attentions", encode_maps(selected, q.encoding)), "application/json"
