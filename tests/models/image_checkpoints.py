"""Random-weight CLIP and SigLIP checkpoints saved by transformers (CLIPModel, SiglipModel),
re-drawn at std 0.1 like every family's (tests/models/checkpoints.py), with their image
processors' preprocessor_config.json and a word-level tokenizer.json (parity tests feed ids).

Small towers: images of 32 px in 8-px patches (16 patches), 2 layers each, heads of 12 and 8.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from tests.models.checkpoints import reinit, write_tokenizer

VOCAB = 100
EOS = VOCAB - 1  # CLIP pools the end token's vector: the first EOS of each row
IMAGE = 32
PATCH = 8


def _text(**extra: object) -> dict[str, object]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 16,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": EOS,
        **extra,
    }


def _vision(**extra: object) -> dict[str, object]:
    return {
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": IMAGE,
        "patch_size": PATCH,
        **extra,
    }


def save_clip(folder: Path, seed: int = 0) -> nn.Module:
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    cfg = CLIPConfig(text_config=_text(), vision_config=_vision(), projection_dim=24)
    model = reinit(CLIPModel._from_config(cfg, attn_implementation="eager"), seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.6592)  # the checkpoints' log(1 / 0.07)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, VOCAB)
    CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}
    ).save_pretrained(folder)
    return model


def save_siglip(folder: Path, seed: int = 0) -> nn.Module:
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    cfg = SiglipConfig(
        text_config=_text(projection_size=48, pad_token_id=1, eos_token_id=1),
        vision_config=_vision(),
    )
    model = reinit(SiglipModel._from_config(cfg, attn_implementation="eager"), seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.3)  # log(10) and -10: SigLIP's initial values
        model.logit_bias.fill_(-10.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, VOCAB)
    SiglipImageProcessorPil(size={"height": IMAGE, "width": IMAGE}).save_pretrained(folder)
    return model


def texts(lengths: list[int], seed: int = 0, pad: int = 0) -> tuple[Tensor, Tensor]:
    """Random ids ending in EOS, right-padded with `pad`: ids, mask (B, N)."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.full((len(lengths), n), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = torch.randint(3, EOS, (length - 1,), generator=g)
        ids[row, length - 1] = EOS
        mask[row, :length] = 1
    return ids, mask


def pixels(count: int, seed: int = 0) -> Tensor:
    """Normalised-looking pixel values (B, 3, IMAGE, IMAGE)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, IMAGE, IMAGE, generator=g)
