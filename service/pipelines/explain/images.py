"""/explain on an image: which patches its vector (or its similarity to a text) rests on.

Occlusion, as for words: the image once whole, then once with each patch replaced by the
normaliser's mean colour (0 in the model's input: the patch carries nothing), every variant
through the vision tower in pieces paced like every explanation (the serving batcher, other
requests batched between pieces). A patch's importance is what the answer loses without it:
1 - cos(whole, occluded) for the image's own vector, or cos(whole, text) - cos(occluded, text)
for its similarity to a text. Beside it, attention rollout from the pooling token (the class
token, SigLIP's probe) over the same patches, and Spearman's correlation of the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.errors import PayloadTooLarge
from service.pipelines.attention.images import ImageAttention, picture
from service.pipelines.base import Prepared
from service.pipelines.call import Call, Timings
from service.pipelines.embed import EmbedPipeline
from service.pipelines.explain.parts import spearman
from service.pipelines.explain.pipeline import ExplainPipeline
from service.pipelines.images import ImagePipeline
from service.settings import Settings
from service.tensors import cosines, l2_normalize


@dataclass
class PatchesExplained:
    grid: int
    importance: np.ndarray  # (grid, grid)
    attention: np.ndarray | None  # (grid, grid): rollout over the patches
    picture: str  # the model's input as a PNG data URI
    score: float | None = None  # the image-text cosine, with a text
    spearman: float | None = None
    attention_note: str | None = None
    timings: Timings = field(default_factory=Timings)


def occlusions(pixels: np.ndarray, grid: int, patch: int) -> list[np.ndarray]:
    """The whole image, then each patch (row by row) set to 0, the normaliser's mean."""
    out = [pixels]
    for r in range(grid):
        for c in range(grid):
            hidden = pixels.copy()
            hidden[:, r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = 0.0
            out.append(hidden)
    return out


class PatchOcclusion:
    def __init__(
        self,
        images: ImagePipeline,
        texts: EmbedPipeline,
        explain: ExplainPipeline,
        settings: Settings,
        attention: ImageAttention | None = None,
    ) -> None:
        self.images, self.texts, self.explain = images, texts, explain
        self.settings = settings
        self.attention = attention
        self.vision = images.vision

    async def run(self, call: Call, ref: str, text: str | None = None) -> PatchesExplained:
        v = self.vision
        tokens, grid = v.tokens, v.grid
        passes = grid * grid + 1
        work = tokens * passes
        if work > self.settings.explain_max_work:
            raise PayloadTooLarge(
                f"occluding {grid * grid} patches is {passes} passes x {tokens} tokens = {work}, "
                f"over the {self.settings.explain_max_work} of HEADWISE_EXPLAIN_MAX_WORK"
            )
        if text is not None:
            self.texts.validate([text], "input")
        per = max(1, self.settings.explain_batch_tokens // tokens)
        held: dict[str, np.ndarray] = {}

        async def prepare() -> Prepared:
            (pixels,) = await self.images.pixels([ref])
            held["pixels"] = pixels
            variants = occlusions(pixels, grid, v.patch_size)
            pieces = [min(per, passes - k) for k in range(0, passes, per)]
            return Prepared([[0] * tokens] * passes, pixels=variants, pieces=pieces)

        async with self.explain.admitted():
            ran = await self.images.intake.run(
                call, prepare, at_least=[tokens] * passes, hold=self.explain.turn, unit="images"
            )
            vectors = l2_normalize(np.stack(ran.rows).astype(np.float32))
            score = None
            if text is None:
                importance = 1.0 - cosines(vectors[1:], vectors[:1].repeat(passes - 1, 0))
            else:
                t = await self.texts.embed(call, [text], normalize=True)
                sims = (vectors.astype(np.float64) @ t.vectors[0].astype(np.float64))
                score = float(sims[0])
                importance = sims[0] - sims[1:]
            rollout, note = None, None
            if self.attention is not None:
                whole = held["pixels"]
                rollout = await self.attention.rollout(call, whole)
                rollout = rollout[int(v.class_token) :]  # the patches' share
            else:
                note = "no attention graph of the vision tower is served (HEADWISE_ATTENTION_ENABLED)"
        grid_importance = importance.reshape(grid, grid)
        return PatchesExplained(
            grid=grid,
            importance=grid_importance,
            attention=rollout.reshape(grid, grid) if rollout is not None else None,
            picture=picture(held["pixels"], v.preprocessing),
            score=score,
            spearman=spearman(importance.tolist(), rollout.tolist() if rollout is not None else None),
            attention_note=note,
            timings=ran.timings,
        )
