"""The image-text families, CLIP and SigLIP (SigLIP 2's fixed-resolution checkpoints load as
SigLIP): two towers, as data.

The text tower is our text encoder configured (pre-norm, learned positions from 0, no embedding
norm, a final norm), pooled and projected as sentence-transformers would (the projection is a
Dense module after pooling):
- CLIP: causal self-attention, the end token's vector (the last real one: the tokenizer ends
  every text with it), projection without bias, quick-GELU FFN.
- SigLIP: bidirectional, the last position's vector (texts padded to the full length and every
  position attended, as the model card runs it), projection with bias, tanh-GELU FFN.
The vision tower is models/vision.py's, configured from vision_config. Tensor names are rules
(regular expressions -> ours), one table for both families: what differs is in the rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from models.config import EncoderConfig
from models.families.base import check_act
from models.vision import VisionConfig

ImageTextKind = Literal["clip", "siglip"]
ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _stack(hf: dict[str, Any], kind: ImageTextKind, **values: Any) -> dict[str, Any]:
    """One tower's encoder numbers from its text_config / vision_config."""
    default = "quick_gelu" if kind == "clip" else "gelu_pytorch_tanh"
    act = check_act(hf, "hidden_act", tuple(ACTIVATIONS), default)
    return {
        "d_model": hf.get("hidden_size", 512 if kind == "clip" else 768),
        "n_heads": hf.get("num_attention_heads", 8 if kind == "clip" else 12),
        "n_layers": hf.get("num_hidden_layers", 12),
        "d_ff": hf.get("intermediate_size", 2048 if kind == "clip" else 3072),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-5 if kind == "clip" else 1e-6),
        "ffn_kind": ACTIVATIONS[act],
        "norm": "pre",
        "type_vocab_size": 0,
        "embedding_norm": False,
        "dropout": 0.0,
        "attn_dropout": 0.0,
        "architecture": kind,
        **values,
    }


def text_config(hf: dict[str, Any], kind: ImageTextKind) -> tuple[EncoderConfig, int]:
    """The text tower's EncoderConfig (its projection a Dense module), and its max length."""
    text = hf.get("text_config") or {}
    d = text.get("hidden_size", 512 if kind == "clip" else 768)
    # CLIP's projection_dim sits on the outer config; SigLIP's projection_size on the text's.
    out = hf.get("projection_dim", 512) if kind == "clip" else text.get("projection_size") or d
    positions = text.get("max_position_embeddings", 77 if kind == "clip" else 64)
    values = _stack(
        text,
        kind,
        vocab_size=text.get("vocab_size", 49408 if kind == "clip" else 32000),
        max_positions=positions,
        positions="learned",
        causal=kind == "clip",
        pooling="lasttoken",
        pad_token_id=min(text.get("pad_token_id", 1) or 0, text.get("vocab_size", 49408) - 1),
        dense_layers=((d, out, kind == "siglip"),),
    )
    return EncoderConfig(**values), positions


def vision_config(hf: dict[str, Any], kind: ImageTextKind) -> VisionConfig:
    vision = hf.get("vision_config") or {}
    size, patch = vision.get("image_size", 224), vision.get("patch_size", 32 if kind == "clip" else 16)
    for name, value in (("image_size", size), ("patch_size", patch)):
        if not isinstance(value, int):
            raise ValueError(f"vision_config {name} {value!r}: only square sizes are supported")
    if kind == "siglip" and not vision.get("vision_use_head", True):
        raise ValueError("a SigLIP vision tower without its attention-pooling head is not supported")
    grid = size // patch
    tokens = grid * grid + (kind == "clip")
    d = vision.get("hidden_size", 768)
    stack = EncoderConfig(
        **_stack(vision, kind, vocab_size=1, max_positions=tokens, positions="none", pooling="cls")
    )
    return VisionConfig(
        stack=stack,
        image_size=size,
        patch_size=patch,
        channels=vision.get("num_channels", 3),
        patch_bias=kind == "siglip",
        class_token=kind == "clip",
        pre_norm=kind == "clip",
        pooling="cls" if kind == "clip" else "map",
        projection=(d, hf.get("projection_dim", 512), False) if kind == "clip" else None,
    )


# One encoder layer's modules, transformers' names -> ours (both towers, both families).
LAYER = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.out_proj": "attn.out_proj",
    "layer_norm1": "norm1",
    "layer_norm2": "norm2",
    "mlp.fc1": "ffn.fc1",
    "mlp.fc2": "ffn.fc2",
}
_LAYER = re.compile(r"^(text|vision)_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_TOWER = {"text": "text.encoder", "vision": "vision.encoder"}

# Everything outside the layers: checkpoint name -> ours ("qkv:" splits a packed in-projection
# into q, k and v along its first axis: nn.MultiheadAttention's in_proj of SigLIP's MAP head).
RULES: tuple[tuple[str, str], ...] = (
    (r"text_model\.embeddings\.token_embedding\.", "text.encoder.embeddings.tokens."),
    (r"text_model\.embeddings\.position_embedding\.", "text.encoder.embeddings.positions."),
    (r"text_model\.final_layer_norm\.", "text.encoder.final_norm."),
    (r"text_projection\.", "text.pool.dense.0."),  # CLIP
    (r"text_model\.head\.", "text.pool.dense.0."),  # SigLIP
    (r"vision_model\.embeddings\.patch_embedding\.", "vision.encoder.embeddings.patch."),
    (r"vision_model\.embeddings\.class_embedding$", "vision.encoder.embeddings.class_token"),
    (r"vision_model\.embeddings\.position_embedding\.", "vision.encoder.embeddings.positions."),
    (r"vision_model\.pre_layrnorm\.", "vision.encoder.embeddings.norm."),
    (r"vision_model\.post_layernorm\.", "vision.encoder.final_norm."),
    (r"visual_projection\.", "vision.projection."),
    (r"vision_model\.head\.probe$", "vision.pool.probe"),
    (r"vision_model\.head\.attention\.in_proj_(weight|bias)$", "qkv:vision.pool.attn.{}_proj.\\1"),
    (r"vision_model\.head\.attention\.out_proj\.", "vision.pool.attn.out_proj."),
    (r"vision_model\.head\.layernorm\.", "vision.pool.norm."),
    (r"vision_model\.head\.mlp\.", "vision.pool.ffn."),
    (r"logit_scale$", "logit_scale"),
    (r"logit_bias$", "logit_bias"),
)
_RULES = tuple((re.compile("^" + pattern), target) for pattern, target in RULES)


def ours(name: str) -> str | tuple[str, ...]:
    """One checkpoint tensor's name(s) in our model; an unknown name comes back as it is
    (and is reported as unexpected)."""
    m = _LAYER.match(name)
    if m and m.group(3) in LAYER:
        tower, layer, module, kind = m.groups()
        return f"{_TOWER[tower]}.layers.{layer}.{LAYER[module]}.{kind}"
    for pattern, target in _RULES:
        found = pattern.match(name)
        if found is None:
            continue
        renamed = pattern.sub(target, name, count=1)
        if renamed.startswith("qkv:"):
            return tuple(renamed[4:].format(part) for part in "qkv")
        return renamed
    return name


@dataclass(frozen=True)
class ImageTextRules:
    """models.weights.assign_weights' view of a family: tensor names -> ours."""

    rename: Callable[[str], str | tuple[str, ...]] = ours

    def tensors(self, name: str, tensor: Tensor, with_head: bool) -> list[tuple[str, Tensor]]:
        if name.endswith("position_ids"):
            return []  # a buffer transformers saves in old checkpoints: we compute positions
        target = self.rename(name)
        if isinstance(target, str):
            return [(target, tensor)]
        return list(zip(target, tensor.chunk(len(target), dim=0), strict=True))

    def is_unused(self, ours: str) -> bool:
        return False


MODEL_TYPES: dict[str, ImageTextKind] = {"clip": "clip", "siglip": "siglip"}


def kind_of(hf: dict[str, Any]) -> ImageTextKind | None:
    """"clip" or "siglip" for a config.json of theirs, None for any other model."""
    return MODEL_TYPES.get(hf.get("model_type", ""))
