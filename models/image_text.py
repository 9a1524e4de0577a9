"""Images and text in one space (CLIP, SigLIP): a text tower and a vision tower, each
projecting into the same space, and how their vectors become zero-shot probabilities.

    t = text tower(ids)   (a SentenceEncoder: models/encoder.py)
    v = vision tower(pixels)   (models/vision.py)
    logit(image, text) = cos(v, t) · exp(s) (+ b)
    CLIP:   P(label | image) = softmax over the labels      (contrastive training)
    SigLIP: P(label | image) = σ(logit), each label alone   (sigmoid training, with its bias b)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import EncoderConfig
from models.encoder import SentenceEncoder
from models.families.clip import ImageTextKind, ImageTextRules, kind_of, text_config, vision_config
from models.vision import VisionConfig, VisionEncoder
from models.weights import assign_weights, read_state_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageTextConfig:
    kind: ImageTextKind
    text: EncoderConfig
    vision: VisionConfig

    @property
    def probabilities(self) -> str:
        """How zero-shot logits become probabilities: over the labels, or each alone."""
        return "softmax" if self.kind == "clip" else "sigmoid"


class ImageTextModel(nn.Module):
    def __init__(self, cfg: ImageTextConfig) -> None:
        super().__init__()
        self.config = cfg
        self.text = SentenceEncoder(cfg.text)
        self.vision = VisionEncoder(cfg.vision)
        # The log of the temperature's inverse: CLIP stores a scalar, SigLIP a (1,) tensor.
        shape = () if cfg.kind == "clip" else (1,)
        self.logit_scale = nn.Parameter(torch.zeros(shape))
        self.logit_bias = nn.Parameter(torch.zeros(shape)) if cfg.kind == "siglip" else None

    def logits(self, image_embeds: Tensor, text_embeds: Tensor) -> Tensor:
        """(I, p), (T, p) -> (I, T): each image against each text, as the model was trained."""
        image, text = F.normalize(image_embeds, dim=-1), F.normalize(text_embeds, dim=-1)
        out = image @ text.T * self.logit_scale.exp()
        return out + self.logit_bias if self.logit_bias is not None else out

    def probabilities(self, logits: Tensor) -> Tensor:
        """Zero-shot label probabilities per image, as the model card computes them."""
        if self.config.kind == "clip":
            return logits.softmax(dim=-1)
        return torch.sigmoid(logits)


@dataclass
class LoadedImageText:
    model: ImageTextModel
    config: ImageTextConfig
    name: str
    source: Path
    max_length: int  # the text tower's
    tokenizer_path: Path | None  # tokenizer.json; None: SigLIP's spiece.model (export converts)
    preprocessor: dict[str, Any] = field(default_factory=dict)  # preprocessor_config.json


def is_image_text(folder: Path) -> bool:
    cfg = folder / "config.json"
    return cfg.exists() and kind_of(json.loads(cfg.read_text())) is not None


def image_text_config(hf: dict[str, Any]) -> tuple[ImageTextConfig, int]:
    kind = kind_of(hf)
    if kind is None:
        raise ValueError(f"model_type {hf.get('model_type')!r} is not an image-text model")
    text, length = text_config(hf, kind)
    return ImageTextConfig(kind, text, vision_config(hf, kind)), length


def load_image_text(folder: str | Path, name: str | None = None) -> LoadedImageText:
    """A CLIP or SigLIP checkpoint folder (CLIPModel / SiglipModel weights) -> both towers."""
    folder = Path(folder)
    hf = json.loads((folder / "config.json").read_text())
    cfg, length = image_text_config(hf)
    with torch.device("meta"):
        model = ImageTextModel(cfg)
    assign_weights(model, read_state_dict(folder), ImageTextRules())
    model.eval()
    tokenizer = folder / "tokenizer.json"
    if not tokenizer.exists() and not (folder / "spiece.model").exists():
        raise FileNotFoundError(f"{folder} has neither tokenizer.json nor spiece.model")
    preprocessor = folder / "preprocessor_config.json"
    if not preprocessor.exists():
        raise FileNotFoundError(f"{folder} has no preprocessor_config.json: how are images prepared?")
    log.info(
        "loaded %s (%s): text %d layers, vision %d layers at %d px in %d-px patches",
        folder,
        cfg.kind,
        cfg.text.n_layers,
        cfg.vision.stack.n_layers,
        cfg.vision.image_size,
        cfg.vision.patch_size,
    )
    return LoadedImageText(
        model=model,
        config=cfg,
        name=name or folder.name,
        source=folder,
        max_length=length,
        tokenizer_path=tokenizer if tokenizer.exists() else None,
        preprocessor=json.loads(preprocessor.read_text()),
    )
