"""Pixel parity with transformers' PIL image processors, and reading preprocessor_config.json.

The reference is `CLIPImageProcessorPil` / `SiglipImageProcessorPil` given `Image.open`'s image
of the same file (as sentence-transformers gives it), or `load_image`'s for the EXIF case;
headwise is `decode` then `preprocess`. The tolerance is the brief's 1e-5; what is measured is 0:
every step is the same arithmetic in the same dtype.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from service.images import ImageLimits, ImagePreprocessing, decode, preprocess
from service.images.preprocessing import center_crop
from tests.service.images.samples import encode, exif_rotated_jpeg, noise, rgba, samples

transformers = pytest.importorskip("transformers")
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil  # noqa: E402
from transformers.image_utils import load_image  # noqa: E402

TOLERANCE = 1e-5
SAMPLES = samples()
CONFIGS = {
    "CLIP defaults": {"image_processor_type": "CLIPImageProcessor"},
    "SigLIP defaults": {"image_processor_type": "SiglipImageProcessor"},
    "CLIP 64": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 64},
        "crop_size": {"height": 64, "width": 64},
    },
    "SigLIP 48 bilinear": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": 48, "width": 48},
        "resample": 2,
    },
    # openai/clip-vit-* as first published: an old type name, ints for sizes.
    "CLIP legacy ints": {
        "feature_extractor_type": "CLIPFeatureExtractor",
        "size": 64,
        "crop_size": 64,
        "resample": 3,
        "do_center_crop": True,
    },
    # transformers reads an int size as a shortest edge for SigLIP too (default_to_square=False).
    "SigLIP int size": {"image_processor_type": "SiglipImageProcessor", "size": 40},
    # A crop bigger than the resized image: transformers pads with zeros.
    "CLIP crop over resize": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 32},
        "crop_size": {"height": 48, "width": 41},
        "image_mean": 0.5,
        "image_std": [0.25, 0.5, 0.75],
    },
    "no resize, no rescale": {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": False,
        "do_rescale": False,
        "crop_size": {"height": 50, "width": 60},
    },
}


def transformers_processor(config: dict):
    name = config.get("image_processor_type") or config.get("feature_extractor_type", "")
    cls = SiglipImageProcessorPil if name.startswith("Siglip") else CLIPImageProcessorPil
    if set(config) <= {"image_processor_type"}:
        return cls()  # the defaults, as a user would construct it
    return cls.from_dict(config)


def reference(image: Image.Image, config: dict) -> np.ndarray:
    out = transformers_processor(config)(image, return_tensors="np")["pixel_values"]
    return np.asarray(out[0])


def ours(data: bytes, config: dict) -> np.ndarray:
    return preprocess(decode(data, ImageLimits()), ImagePreprocessing.from_config(config))


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("sample", list(SAMPLES))
def test_pixels_match_the_transformers_pil_processor(sample, config_name):
    data, config = SAMPLES[sample], CONFIGS[config_name]
    expected = reference(Image.open(io.BytesIO(data)), config)
    got = ours(data, config)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOLERANCE


@pytest.mark.parametrize("config_name", ["CLIP defaults", "SigLIP 48 bilinear"])
def test_exif_orientation_matches_load_image_then_the_processor(config_name):
    data, config = exif_rotated_jpeg(120, 80), CONFIGS[config_name]
    upright = load_image(base64.b64encode(data).decode())  # transformers applies the EXIF tag
    assert upright.size == (80, 120)
    expected = reference(upright, config)
    assert np.abs(ours(data, config) - expected).max() <= TOLERANCE


def test_transparency_follows_the_processor_not_load_image():
    """The one place transformers' two paths disagree: the processor composites alpha onto
    white; `load_image` drops it first (keeping the colour under transparent pixels). We take
    the processor's, which is also what the image looks like."""
    data, config = encode(rgba(120, 90), "PNG"), CONFIGS["CLIP 64"]
    got = ours(data, config)
    assert np.abs(got - reference(Image.open(io.BytesIO(data)), config)).max() <= TOLERANCE
    dropped = reference(load_image(base64.b64encode(data).decode()), config)
    assert np.abs(got - dropped).max() > 0.1


def test_the_output_is_contiguous_channels_first_float32():
    out = ours(SAMPLES["noise 97x413 PNG"], CONFIGS["CLIP 64"])
    assert out.shape == (3, 64, 64) and out.dtype == np.float32 and out.flags.c_contiguous


# Reading preprocessor_config.json


def test_defaults_are_those_of_each_processor():
    clip = ImagePreprocessing.from_config({"image_processor_type": "CLIPImageProcessor"})
    siglip = ImagePreprocessing.from_config({"image_processor_type": "SiglipImageProcessor"})
    for ours_, theirs in ((clip, CLIPImageProcessorPil()), (siglip, SiglipImageProcessorPil())):
        assert ours_.do_convert_rgb == theirs.do_convert_rgb
        assert ours_.resample == int(theirs.resample)
        assert ours_.do_center_crop == bool(theirs.do_center_crop)
        assert ours_.rescale_factor == theirs.rescale_factor
        assert ours_.image_mean == tuple(theirs.image_mean)
        assert ours_.image_std == tuple(theirs.image_std)
    assert clip.shortest_edge == 224 and (clip.crop_height, clip.crop_width) == (224, 224)
    assert (siglip.resize_height, siglip.resize_width) == (224, 224)


def test_a_null_value_means_the_default_as_in_transformers():
    p = ImagePreprocessing.from_config(
        {"image_processor_type": "CLIPImageProcessor", "do_center_crop": None, "size": None}
    )
    assert p.do_center_crop and p.shortest_edge == 224


@pytest.mark.parametrize(
    "type_name", ["CLIPImageProcessorFast", "CLIPImageProcessorPil", "SiglipImageProcessorFast"]
)
def test_backend_suffixes_name_the_same_processor(type_name):
    assert ImagePreprocessing.from_config({"image_processor_type": type_name}).processor_type in (
        "CLIPImageProcessor",
        "SiglipImageProcessor",
    )


@pytest.mark.parametrize("config", [{"image_processor_type": "ViTImageProcessor"}, {}])
def test_an_unknown_processor_type_is_refused_naming_the_supported_ones(config):
    with pytest.raises(ValueError, match="not supported.*CLIPImageProcessor.*SiglipImageProcessor"):
        ImagePreprocessing.from_config(config)


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({"do_pad": True}, "do_pad"),
        ({"size": {"shortest_edge": 224, "longest_edge": 448}}, "size"),
        ({"size": {"max_height": 224, "max_width": 224}}, "size"),
        ({"image_mean": [0.5, 0.5]}, "image_mean needs 3 values"),
        ({"crop_size": "big"}, "crop_size"),
    ],
)
def test_configs_it_cannot_follow_are_refused(extra, problem):
    with pytest.raises(ValueError, match=problem):
        ImagePreprocessing.from_config({"image_processor_type": "CLIPImageProcessor", **extra})


def test_the_model_is_frozen_and_takes_no_unknown_fields():
    p = ImagePreprocessing.from_config({"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(ValidationError):
        p.resample = 2  # type: ignore[misc]
    with pytest.raises(ValidationError):
        ImagePreprocessing(**{**p.model_dump(), "colour": "blue"})
    with pytest.raises(ValidationError, match="either shortest_edge or both"):
        ImagePreprocessing(**{**p.model_dump(), "resize_height": 10, "resize_width": 10})


def test_output_size_is_fixed_by_a_crop_or_an_exact_resize_only():
    def of(**config):
        return ImagePreprocessing.from_config(config).output_size

    assert of(image_processor_type="CLIPImageProcessor") == (224, 224)
    assert of(image_processor_type="SiglipImageProcessor", size={"height": 48, "width": 32}) == (
        48,
        32,
    )
    assert of(image_processor_type="SiglipImageProcessor", size=40) is None


@pytest.mark.parametrize(
    "height, width, expected", [(197, 301, (64, 97)), (413, 97, (272, 64)), (64, 64, (64, 64))]
)
def test_a_shortest_edge_resize_truncates_the_long_side_as_transformers_does(
    height, width, expected
):
    p = ImagePreprocessing.from_config(CONFIGS["CLIP 64"])
    assert p.resized_size(height, width) == expected


def test_center_crop_pads_a_small_image_with_zeros_centred():
    pixels = np.ones((3, 2, 3), dtype=np.uint8)
    out = center_crop(pixels, 4, 5)
    assert out.shape == (3, 4, 5)
    assert out[0].tolist() == [[0] * 5, [0, 1, 1, 1, 0], [0, 1, 1, 1, 0], [0] * 5]


def test_preprocess_without_rgb_conversion_refuses_a_grey_image():
    p = ImagePreprocessing.from_config(
        {"image_processor_type": "CLIPImageProcessor", "do_convert_rgb": False}
    )
    with pytest.raises(ValueError, match="do_convert_rgb"):
        preprocess(noise(10, 10, channels=1), p)
