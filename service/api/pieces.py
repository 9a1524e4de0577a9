"""Texts and images in one request, for the dialects whose bodies carry both: Cohere's `images`
and `inputs`, Voyage's multimodal `inputs`, vLLM's chat `messages`, Infinity's `modality`.

An image-text model (CLIP, SigLIP) embeds a text with its text tower and an image with its
vision tower, into one space; it cannot read a text and an image as one sequence, as the
vendors' own multimodal models (Cohere's embed-v4, Voyage's voyage-multimodal-3) read an
interleaved input. So an input here is one piece, a text or an image, and `one_piece` refuses
an input of several with a 422 that says why. A request's pieces are checked before anything
runs, go to both towers at once (as headwise's /encode sends its `inputs` and `images`), and
their vectors come back in the request's order.
"""

from __future__ import annotations

import re
from asyncio import gather
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

import numpy as np

from service.api.context import Context
from service.errors import InvalidInput
from service.images import ImageError
from service.pipelines.call import Call, Timings
from service.pipelines.embed import Encoded, Tokenizing
from service.registry import Model


@dataclass(frozen=True)
class Image:
    """An image reference: a data URI, bare base64, or an http(s) URL of an allowed host."""

    ref: str


Piece = str | Image  # a text, or an image


@dataclass
class Mixed:
    vectors: np.ndarray  # (n, d): one per piece, in the request's order, L2-normalised
    tokens: list[int]  # per piece: a text's tokens; an image's, the sequence its tower ran
    texts: int  # how many pieces were texts
    text_tokens: int
    image_tokens: int
    image_pixels: int  # the pixels the vision tower took in (its input size, per image)
    timings: Timings

    @property
    def images(self) -> int:
        return len(self.tokens) - self.texts


def one_piece(content: Sequence[Piece], where: str, param: str) -> Piece:
    """An input's one piece; an input of several is refused, saying why."""
    if len(content) == 1:
        return content[0]
    kinds = ", ".join("image" if isinstance(p, Image) else "text" for p in content)
    raise InvalidInput(
        f"{where} has {len(content)} pieces ({kinds}): an image-text model (CLIP, SigLIP) "
        "embeds a text or an image, each on its own tower, and cannot make one vector of "
        "several pieces; send each text and each image as an input of its own",
        param=param,
    )


_IMAGE_AT = re.compile(r"^image (\d+): ")


def model_for(ctx: Context, name: str | None, pieces: Sequence[Piece]) -> Model:
    """The model that answers: one that takes images if a piece is one, else the route's."""
    return ctx.model(name, "images" if any(isinstance(p, Image) for p in pieces) else None)


async def embed(
    call: Call,
    model: Model,
    pieces: Sequence[Piece],
    how: Tokenizing | None = None,
    dimensions: int | None = None,
    param: str = "inputs",
) -> Mixed:
    """Every piece's vector (L2-normalised, `dimensions` kept), texts and images at once."""
    text_at = [i for i, p in enumerate(pieces) if isinstance(p, str)]
    image_at = [i for i, p in enumerate(pieces) if isinstance(p, Image)]
    texts = [p for p in pieces if isinstance(p, str)]
    refs = [p.ref for p in pieces if isinstance(p, Image)]
    text_tower, vision = model.embed, model.images
    assert text_tower is not None
    text_tower.check_dimensions(dimensions)
    if texts:
        text_tower.validate(texts, param, dimensions)
    if refs:
        assert vision is not None, "model_for picks a model that takes images"
        vision.check(refs, param)
    work = []
    if texts:
        work.append(text_tower.embed(call, list(texts), how or Tokenizing(), True, dimensions))
    if vision is not None and refs:
        work.append(_images(vision.embed(call, refs, True, dimensions), image_at, param))
    done: list[Encoded] = list(await gather(*work))
    order = np.argsort(np.array(text_at + image_at))  # the concatenation back in request order
    vectors = np.concatenate([d.vectors for d in done])[order]
    tokens = [n for d in done for n in d.tokens]
    timings = done[0].timings
    for d in done[1:]:
        timings.tokens += d.timings.tokens
    text_tokens = sum(done[0].tokens) if texts else 0
    side = vision.vision.image_size if vision is not None else 0
    return Mixed(
        vectors=vectors,
        tokens=[tokens[i] for i in order],
        texts=len(texts),
        text_tokens=text_tokens,
        image_tokens=sum(tokens) - text_tokens,
        image_pixels=len(refs) * side * side,
        timings=timings,
    )


async def _images(run: Awaitable[Encoded], image_at: list[int], param: str) -> Encoded:
    """The vision tower's answer; an image's error also names its place in the request where
    that differs from its place among the images ("inputs[2]: image 0: ...")."""
    try:
        return await run
    except ImageError as exc:
        found = _IMAGE_AT.match(exc.message)
        k = int(found.group(1)) if found else None
        if k is None or k >= len(image_at) or image_at[k] == k:
            raise
        raise ImageError(f"{param}[{image_at[k]}]: {exc.message}", exc.status) from None
