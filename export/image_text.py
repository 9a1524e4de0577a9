"""An image-text model's bundle (CLIP, SigLIP): the text tower as any embedding model's graphs
(export/bundle.py), the vision tower's beside them (export/vision.py), and in the manifest how
images are prepared and how zero-shot probabilities are taken.

SigLIP ships a SentencePiece spiece.model and no tokenizer.json: export/spiece.py converts it,
checked against SiglipTokenizer. The text tower is a SentenceEncoder whose projection is a Dense module after pooling, so every
text route serves it unchanged; its vectors and the images' share one space.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from export import verify
from export.bundle import ExportOptions, build_bundle
from export.spiece import write_siglip_tokenizer
from export.vision import Captions, VisionExport, build_vision, zero_shot
from models.image_text import LoadedImageText
from models.weights import LoadedModel
from service.engine.runtime import pad_to_length
from service.images.preprocessing import ImagePreprocessing
from service.manifest import Manifest, Source


def text_tower(loaded: LoadedImageText, tokenizer: Path) -> LoadedModel:
    """The text tower as an embedding model (its vectors not normalised, as the reference's)."""
    return LoadedModel(
        model=loaded.model.text,
        config=loaded.config.text,
        name=loaded.name,
        source=loaded.source,
        max_length=loaded.max_length,
        normalize=False,
        tokenizer_path=tokenizer,
    )


def build_image_text(
    loaded: LoadedImageText,
    out: Path,
    options: ExportOptions | None = None,
    source: Source | None = None,
    template: str | None = None,
) -> Manifest:
    options = options or ExportOptions()
    if options.pruning is not None:
        raise ValueError("pruning supports BERT-generation text embedders, not image-text models")
    preprocessing = ImagePreprocessing.from_config(loaded.preprocessor)
    model = loaded.model
    padding: Literal["longest", "max_length"] = (
        "max_length" if loaded.config.kind == "siglip" else "longest"
    )

    text_options = replace(options, text_padding=padding, release_weights=False)
    settings = VisionExport(
        fp16=options.fp16,
        allow_unfused=options.allow_unfused,
        int8=options.int8,
        int8_images=min(options.int8_pairs, VisionExport.int8_images),
        int8_max_drop=options.int8_max_drop,
        int8_min_spearman=options.int8_min_spearman,
    )

    with tempfile.TemporaryDirectory(prefix="headwise-spiece-") as converted:
        tokenizer = loaded.tokenizer_path or write_siglip_tokenizer(
            loaded.source, Path(converted), verify.PROBE_TEXTS
        )
        text = text_tower(loaded, tokenizer)

        def vision(tmp: Path) -> dict[str, Any]:
            captions = caption_vectors(text, padding)
            return {
                "vision": build_vision(model, preprocessing, tmp, settings, captions),
                "zero_shot": zero_shot(model, template),
            }

        return build_bundle(text, out, text_options, source, towers=vision)


def caption_vectors(text: LoadedModel, padding: str) -> Captions:
    """The fp32 text tower's vectors of texts tokenised and padded as the service does: the
    vision tower's int8 gate retrieves its captions with them."""
    tok = Tokenizer.from_file(str(text.tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(max_length=text.max_length)
    pad = text.config.pad_token_id
    if padding == "max_length":
        pad_to_length(tok, text.max_length, pad)

    def run(texts: list[str]) -> np.ndarray:
        parts = []
        for start in range(0, len(texts), 64):
            feeds = verify.encode(tok, texts[start : start + 64], ["input_ids", "attention_mask"], pad)
            parts.append(verify.torch_outputs(text.model, feeds["input_ids"], feeds["attention_mask"]))
        return np.concatenate(parts)

    return run
