"""Pixels for CLIP and SigLIP image towers, as transformers' PIL image processors make them.

`ImagePreprocessing` records what a checkpoint's `preprocessor_config.json` says, with the defaults
transformers 5 fills in for keys it leaves out; `preprocess` replays the steps of
`CLIPImageProcessorPil` / `SiglipImageProcessorPil` (`PilBackend._preprocess`) on one image,
without torch or transformers:

1. RGB, transparency composited onto white (`image_transforms.convert_to_rgb`);
2. resize with PIL (`Image.resize`, the config's `resample`, no `reducing_gap`) to the exact
   height/width, or so the short side is `shortest_edge`, the long side truncated as
   `get_resize_output_image_size` does: `int(shortest_edge * long / short)`;
3. centre crop on the uint8 pixels, zero-padded where the image is smaller than the crop;
4. rescale in float64 then cast to float32 (`image_transforms.rescale`);
5. normalise in float32 with float32 mean and std (`image_transforms.normalize`).

Each step is the same arithmetic in the same dtype, so the output equals the processor's
`pixel_values` bit for bit (the tests measure a max abs difference of 0). Not reproduced:

* the torchvision backend (`CLIPImageProcessor`, what `AutoImageProcessor` picks when torchvision
  is installed) resizes with torch and differs from the PIL backend by up to a few 1e-2; the
  config's numbers are the same for both, and this module follows the PIL backend;
* the size rules CLIP and SigLIP configs do not use (`longest_edge`, `max_height`/`max_width`,
  `min_pixels`/`max_pixels`) and padding (`do_pad`): `from_config` refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import ceil
from typing import Any, Literal

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, model_validator

ProcessorType = Literal["CLIPImageProcessor", "SiglipImageProcessor"]

# transformers.utils.constants
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)

# The names a config may give each processor: the torchvision and PIL backends and the older
# feature extractor read the same keys (`CLIPFeatureExtractor` in openai/clip-vit-* configs).
PROCESSOR_TYPES: dict[str, ProcessorType] = {
    "CLIPImageProcessor": "CLIPImageProcessor",
    "CLIPImageProcessorFast": "CLIPImageProcessor",
    "CLIPImageProcessorPil": "CLIPImageProcessor",
    "CLIPFeatureExtractor": "CLIPImageProcessor",
    "SiglipImageProcessor": "SiglipImageProcessor",
    "SiglipImageProcessorFast": "SiglipImageProcessor",
    "SiglipImageProcessorPil": "SiglipImageProcessor",
}

# The class attributes of CLIPImageProcessorPil and SiglipImageProcessorPil (transformers 5.24).
DEFAULTS: dict[ProcessorType, dict[str, Any]] = {
    "CLIPImageProcessor": {
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"shortest_edge": 224},
        "default_to_square": False,
        "resample": int(Image.Resampling.BICUBIC),
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": OPENAI_CLIP_MEAN,
        "image_std": OPENAI_CLIP_STD,
    },
    "SiglipImageProcessor": {
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"height": 224, "width": 224},
        "default_to_square": False,
        "resample": int(Image.Resampling.BICUBIC),
        "do_center_crop": False,
        "crop_size": None,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": IMAGENET_STANDARD_MEAN,
        "image_std": IMAGENET_STANDARD_STD,
    },
}

# Keys that would change the pixels in ways these processors' checkpoints never ask for.
REFUSED_WHEN_SET = ("do_pad", "use_square_size")

Triple = tuple[float, float, float]


class ImagePreprocessing(BaseModel):
    """What one checkpoint's image processor does to an image, as plain data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    processor_type: ProcessorType
    do_convert_rgb: bool
    do_resize: bool
    shortest_edge: int | None = Field(default=None, gt=0)  # CLIP: short side to this
    resize_height: int | None = Field(default=None, gt=0)  # SigLIP: exactly this size
    resize_width: int | None = Field(default=None, gt=0)
    resample: int = Field(ge=0, le=5)  # PIL's Image.Resampling: 2 bilinear, 3 bicubic
    do_center_crop: bool
    crop_height: int | None = Field(default=None, gt=0)
    crop_width: int | None = Field(default=None, gt=0)
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: Triple
    image_std: Triple

    @model_validator(mode="after")
    def _coherent(self) -> ImagePreprocessing:
        by_edge = self.shortest_edge is not None
        by_size = (self.resize_height, self.resize_width) != (None, None)
        if by_edge == by_size or (by_size and None in (self.resize_height, self.resize_width)):
            raise ValueError("give either shortest_edge or both resize_height and resize_width")
        if self.do_center_crop and (self.crop_height is None or self.crop_width is None):
            raise ValueError("do_center_crop needs crop_height and crop_width")
        if self.do_normalize and 0.0 in self.image_std:
            raise ValueError("image_std must not contain 0")
        return self

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ImagePreprocessing:
        """Read a `preprocessor_config.json` dict; keys it leaves out (or sets to null, which
        transformers also reads as "use the default") take the processor's defaults."""
        name = config.get("image_processor_type") or config.get("feature_extractor_type")
        if name not in PROCESSOR_TYPES:
            raise ValueError(
                f"image processor type {name!r} is not supported; headwise reads "
                f"{', '.join(sorted(PROCESSOR_TYPES))}"
            )
        processor_type = PROCESSOR_TYPES[name]
        for key in REFUSED_WHEN_SET:
            if config.get(key):
                raise ValueError(f"{name} with {key}={config[key]!r} is not supported")
        given = {k: v for k, v in config.items() if v is not None}
        v = {
            **DEFAULTS[processor_type],
            **{k: given[k] for k in DEFAULTS[processor_type] if k in given},
        }

        size = size_dict(v["size"], default_to_square=bool(v["default_to_square"]), name="size")
        crop = size_dict(v["crop_size"], True, "crop_size") if v["crop_size"] is not None else {}
        if set(size) not in ({"shortest_edge"}, {"height", "width"}):
            raise ValueError(
                f"size {size} is not supported: give shortest_edge, or height and width"
            )
        return cls(
            processor_type=processor_type,
            do_convert_rgb=v["do_convert_rgb"],
            do_resize=v["do_resize"],
            shortest_edge=size.get("shortest_edge"),
            resize_height=size.get("height"),
            resize_width=size.get("width"),
            resample=int(v["resample"]),
            do_center_crop=v["do_center_crop"],
            crop_height=crop.get("height"),
            crop_width=crop.get("width"),
            do_rescale=v["do_rescale"],
            rescale_factor=v["rescale_factor"],
            do_normalize=v["do_normalize"],
            image_mean=triple(v["image_mean"], "image_mean"),
            image_std=triple(v["image_std"], "image_std"),
        )

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize step, for an input of this size."""
        if not self.do_resize:
            return height, width
        if self.resize_height is not None and self.resize_width is not None:
            return self.resize_height, self.resize_width
        assert self.shortest_edge is not None  # the validator's either/or
        # transformers.image_transforms.get_resize_output_image_size(default_to_square=False)
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output, or None where it follows the input's aspect ratio
        (a shortest-edge resize with no crop)."""
        if self.do_center_crop:
            assert self.crop_height is not None and self.crop_width is not None
            return self.crop_height, self.crop_width
        if self.do_resize and self.resize_height is not None and self.resize_width is not None:
            return self.resize_height, self.resize_width
        return None


def size_dict(value: Any, default_to_square: bool, name: str) -> dict[str, int]:
    """A config's `size` / `crop_size` as a dict, read as `get_size_dict` reads it: an int is a
    square when `default_to_square`, else a shortest edge; a pair is (height, width)."""
    if isinstance(value, Mapping):
        return {str(k): int(n) for k, n in value.items()}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"height": value, "width": value} if default_to_square else {"shortest_edge": value}
    if isinstance(value, list | tuple) and len(value) == 2:
        return {"height": int(value[0]), "width": int(value[1])}
    raise ValueError(f"{name} {value!r} is not an int, a (height, width) pair or a dict")


def triple(value: Any, name: str) -> Triple:
    """One value per RGB channel; a single number applies to all three, as in `normalize`."""
    if isinstance(value, int | float):
        return float(value), float(value), float(value)
    values = tuple(float(x) for x in value)
    if len(values) != 3:
        raise ValueError(f"{name} needs 3 values (R, G, B), got {len(values)}")
    return values[0], values[1], values[2]


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as `transformers.image_transforms.convert_to_rgb` makes it: an image with an alpha band
    or a transparent colour is composited onto opaque white; any other mode is `convert("RGB")`
    (which clips 16-bit and 32-bit integer values to 0..255, it does not scale them)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def preprocess(image: Image.Image, p: ImagePreprocessing) -> np.ndarray:
    """float32 (3, H, W) pixels for the image tower, equal to the PIL processor's `pixel_values`."""
    if p.do_convert_rgb:
        image = to_rgb(image)
    elif image.mode != "RGB":
        raise ValueError(f"an {image.mode} image needs do_convert_rgb; this config turns it off")
    if p.do_resize:
        height, width = p.resized_size(image.height, image.width)
        image = image.resize((width, height), resample=p.resample)
    pixels: np.ndarray = np.asarray(image).transpose(2, 0, 1)  # (3, H, W) uint8
    if p.do_center_crop:
        assert p.crop_height is not None and p.crop_width is not None
        pixels = center_crop(pixels, p.crop_height, p.crop_width)
    if p.do_rescale:
        pixels = (pixels.astype(np.float64) * p.rescale_factor).astype(np.float32)
    if p.do_normalize:
        if not np.issubdtype(pixels.dtype, np.floating):
            pixels = pixels.astype(np.float32)
        mean = np.array(p.image_mean, dtype=pixels.dtype)[:, None, None]  # (3, 1, 1)
        std = np.array(p.image_std, dtype=pixels.dtype)[:, None, None]
        pixels = (pixels - mean) / std
    return np.ascontiguousarray(pixels, dtype=np.float32)


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre (height, width) of (C, H, W) pixels, zero-padded where the image is smaller:
    `transformers.image_transforms.center_crop`, its rounding included."""
    _, h, w = pixels.shape
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top : top + height, left : left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((pixels.shape[0], new_h, new_w), dtype=pixels.dtype)
    top_pad, left_pad = ceil((new_h - h) / 2), ceil((new_w - w) / 2)
    padded[:, top_pad : top_pad + h, left_pad : left_pad + w] = pixels
    top, left = top + top_pad, left + left_pad
    return padded[
        :, max(0, top) : min(new_h, top + height), max(0, left) : min(new_w, left + width)
    ]
