"""Images in, vectors out (an image-text model's vision tower), and zero-shot labels.

Each image reference (a data URI, base64, or a URL of a host the operator allows) becomes bytes,
an upright RGB picture within the size limits, then the pixels its checkpoint's processor would
make (service/images); at most `image_decode_threads` images decode at once, off the event
loop and below inference's CPU priority. Pixels go through the one intake like text: admitted by their measured cost (an image
counts as the tokens its tower runs: the patches and the class token), batched with other
requests' images, answered by the deadline. Vectors are post-processed as text vectors are.

Zero-shot: each label's text (the model card's template) goes through the text tower, the
image through the vision tower, at once; logit = cos · scale + bias, and the probabilities as
the model was trained (softmax over the labels for CLIP, each label's sigmoid for SigLIP).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.engine.batcher import lower_priority
from service.engine.runtime import Backend
from service.errors import InvalidInput
from service.images import FetchPolicy, ImageError, ImageLimits, decode, preprocess, read_image_ref
from service.manifest import VisionTower, ZeroShot
from service.pipelines.base import Intake, Prepared, postprocess
from service.pipelines.call import Call, Timings
from service.pipelines.embed import EmbedPipeline, Encoded
from service.settings import Settings
from service.tensors import l2_normalize

DECODE_NICE = 10  # decoding's CPU priority: below inference's (0), above the long lane's (19)


@dataclass
class Labelled:
    probabilities: list[float]  # per label, in the request's order
    logits: list[float]
    timings: Timings = field(default_factory=Timings)


class ImagePipeline:
    def __init__(self, backend: Backend, intake: Intake, settings: Settings) -> None:
        vision = backend.manifest.vision
        if vision is None:
            raise ValueError(f"{backend.manifest.name} has no vision tower")
        self.backend = backend
        self.manifest = backend.manifest
        self.vision: VisionTower = vision
        self.intake = intake
        self.settings = settings
        self.policy = FetchPolicy(
            frozenset(settings.image_url_hosts),
            settings.image_max_bytes,
            settings.image_fetch_timeout_s,
        )
        self.limits = ImageLimits(settings.image_max_bytes, settings.image_max_pixels)
        # Decoding runs below inference's priority: on a machine whose cores the graph already
        # uses, a decode beside a running batch would make the batch's threads wait for it
        # (ONNX Runtime's threads meet at every op); at nice 10 it takes the time they leave.
        self._decoder = ThreadPoolExecutor(
            settings.image_decode_threads,
            thread_name_prefix=f"decode-{backend.manifest.name}",
            initializer=functools.partial(lower_priority, DECODE_NICE),
        )

    @property
    def tokens(self) -> int:
        """What one image costs the vision tower, in the tokens its layers run."""
        return self.vision.tokens

    def check(self, refs: list[str], name: str = "images") -> None:
        if not refs:
            raise InvalidInput(f"{name} must not be an empty list", param=name)
        if len(refs) > self.settings.max_images:
            raise InvalidInput(
                f"{name} has {len(refs)} images; the limit is {self.settings.max_images} per "
                "request (HEADWISE_MAX_IMAGES)",
                param=name,
            )

    def _pixels(self, ref: str, index: int) -> np.ndarray:
        """One reference -> its pixel values (C, H, W); an ImageError names the image."""
        try:
            image = decode(read_image_ref(ref, self.policy), self.limits)
            try:
                return preprocess(image, self.vision.preprocessing)
            finally:
                image.close()
        except ImageError as exc:
            raise exc.at(index) from None

    async def pixels(self, refs: list[str]) -> list[np.ndarray]:
        """Every image prepared, a few at a time off the event loop."""
        loop = asyncio.get_running_loop()
        tasks = [
            loop.run_in_executor(self._decoder, self._pixels, ref, i) for i, ref in enumerate(refs)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise

    async def embed(
        self,
        call: Call,
        refs: list[str],
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> Encoded:
        """Image vectors in the text tower's space; normalize None: the model's default."""
        self.check(refs)
        placeholder = [0] * self.tokens  # the ids of an image's sequence: its cost, not its data

        async def prepare() -> Prepared:
            pixels = await self.pixels(refs)
            return Prepared([placeholder] * len(refs), pixels=pixels)

        ran = await self.intake.run(call, prepare, at_least=[self.tokens] * len(refs), unit="images")
        if normalize is None:
            normalize = self.manifest.normalize
        vectors = postprocess(np.stack(ran.rows), normalize, dimensions)
        return Encoded(vectors, ran.lengths, ran.timings)

    def zero_shot_spec(self) -> ZeroShot:
        if self.manifest.zero_shot is None:
            raise InvalidInput(f"{self.manifest.name} has no zero-shot figures in its manifest")
        return self.manifest.zero_shot

    async def classify(
        self,
        call: Call,
        ref: str,
        labels: list[str],
        texts: EmbedPipeline,
        template: str | None = None,
    ) -> Labelled:
        """One image's probability for each candidate label, as the model card computes it."""
        spec = self.zero_shot_spec()
        if not labels:
            raise InvalidInput("labels must not be an empty list", param="labels")
        if len(labels) > self.settings.max_inputs:
            raise InvalidInput(
                f"labels has {len(labels)} items; the limit is {self.settings.max_inputs}",
                param="labels",
            )
        fmt = template or spec.template
        try:
            prompts = [fmt.format(label=label) for label in labels]
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidInput(
                f"template {fmt!r} must hold {{label}} and nothing else to fill in ({exc})",
                param="template",
            ) from None
        image, text = await asyncio.gather(
            self.embed(call, [ref], normalize=True),
            texts.embed(call, list(prompts), normalize=True),
        )
        logits = (l2_normalize(image.vectors) @ l2_normalize(text.vectors).T)[0]
        logits = logits.astype(np.float64) * spec.scale + spec.bias
        if spec.probabilities == "softmax":
            shifted = np.exp(logits - logits.max())
            probs = shifted / shifted.sum()
        else:
            probs = 1.0 / (1.0 + np.exp(-logits))
        timings = image.timings
        timings.tokens += text.timings.tokens
        return Labelled([float(p) for p in probs], [float(x) for x in logits], timings)
