"""Image input for CLIP and SigLIP models, without torch: a request's reference to bytes
(`source`), bytes to an upright RGB image within limits (`decode`, which reads the format and
the stated size first, `formats`), and the image to the pixels the checkpoint's processor would
make (`preprocessing`). Every failure is an `ImageError` with its HTTP status (`errors`)."""

from service.images.decode import ImageLimits, decode
from service.images.errors import ImageError
from service.images.formats import ALLOWED_FORMATS
from service.images.preprocessing import ImagePreprocessing, preprocess
from service.images.source import FetchPolicy, read_image_ref

__all__ = [
    "ALLOWED_FORMATS",
    "FetchPolicy",
    "ImageError",
    "ImageLimits",
    "ImagePreprocessing",
    "decode",
    "preprocess",
    "read_image_ref",
]
