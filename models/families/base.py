"""What a checkpoint family is, as data: config translation, tensor-name rules, head layout.

A tensor-name rule maps a checkpoint name (after the family's prefix) onto ours. A rule whose
target is a tuple splits one fused checkpoint tensor into equal parts along its first axis
(ModernBERT's and NomicBERT's Wqkv -> q, k, v; ModernBERT's Wi -> gate, up).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from models.config import HeadKind, Pooling

Target = str | tuple[str, ...]


def _always(hf: dict[str, Any]) -> bool:
    return True


def _first_token(hf: dict[str, Any]) -> Pooling:
    return "cls"


class TensorRules(Protocol):
    """How a checkpoint's tensors become ours: a Family, or the image-text families' table."""

    def tensors(self, name: str, tensor: Tensor, with_head: bool) -> list[tuple[str, Tensor]]: ...
    def is_unused(self, ours: str) -> bool: ...


@dataclass(frozen=True)
class Family:
    architecture: str  # our name, recorded in the manifest
    model_types: tuple[str, ...]  # config.json "model_type" values
    prefix: str  # the base model's prefix inside task checkpoints ("roberta.")
    config: Callable[[dict[str, Any]], dict[str, Any]]  # config.json -> EncoderConfig values
    exact: dict[str, str]  # whole names (after the prefix)
    layer_prefix: str | tuple[str, ...]  # "encoder.layer" / "transformer.layer" / either of
    layer: dict[str, Target]  # inside one layer
    head: dict[str, str]  # classification-head modules, as named in the checkpoint
    head_kind: HeadKind | None  # None: no sequence-classification checkpoints
    ignored: re.Pattern[str] = field(
        default=re.compile(
            r"^(pooler\.|cls\.|lm_head\.|embeddings\.(position_ids|token_type_ids)$)"
        )
    )
    # Which config.json dialect this entry reads, when one model_type has several (NomicBERT).
    dialect: Callable[[dict[str, Any]], bool] = _always
    # How the classification head pools the text's tokens (ModernBERT: classifier_pooling).
    head_pooling: Callable[[dict[str, Any]], Pooling] = _first_token
    # Our names a checkpoint may carry that this configuration has no use for (DeBERTa-v3
    # checkpoints keep an absolute position table that position_biased_input=false ignores).
    unused: re.Pattern[str] | None = None
    # The masked-LM head's modules, ours -> the checkpoint's (a SPLADE model's vocabulary
    # logits, models/outputs.py): dense, norm, decoder (often tied to the token embeddings:
    # absent), and the vocabulary bias when it is stored apart from the decoder. Empty: none.
    mlm_head: dict[str, str] = field(default_factory=dict)

    def to_ours(self, name: str, with_head: bool) -> Target | None:
        """One checkpoint tensor name -> ours (a tuple: the parts of a fused tensor); None
        for one we deliberately skip."""
        if with_head:
            for theirs, ours in self.head.items():
                if name.startswith(theirs + "."):
                    return "head." + ours + name[len(theirs) :]
        for prefix in (self.prefix, "model.", "0.auto_model."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        if self.ignored.match(name) or (not with_head and self.is_head(name)):
            return None
        stem, _, kind = name.rpartition(".")
        if stem in self.exact:
            return f"{self.exact[stem]}.{kind}"
        prefixes = (self.layer_prefix,) if isinstance(self.layer_prefix, str) else self.layer_prefix
        m = re.match(rf"^(?:{'|'.join(map(re.escape, prefixes))})\.(\d+)\.(.+)$", stem)
        if m and m.group(2) in self.layer:
            target = self.layer[m.group(2)]
            parts = (target,) if isinstance(target, str) else target
            names = tuple(f"encoder.layers.{m.group(1)}.{p}.{kind}" for p in parts)
            return names[0] if isinstance(target, str) else names
        return name  # unknown: reported as unexpected

    def tensors(self, name: str, tensor: Tensor, with_head: bool) -> list[tuple[str, Tensor]]:
        """Our (name, tensor) pairs for one checkpoint tensor: none when it is skipped, several
        for a fused one (split in equal parts along its first axis)."""
        ours = self.to_ours(name, with_head)
        if ours is None:
            return []
        if isinstance(ours, str):
            return [(ours, tensor)]
        return list(zip(ours, tensor.chunk(len(ours), dim=0), strict=True))

    def is_head(self, name: str) -> bool:
        return any(name.startswith(h + ".") for h in self.head)

    def is_unused(self, ours: str) -> bool:
        return self.unused is not None and self.unused.match(ours) is not None


def check_act(hf: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    """The config's activation, refused by name unless ours computes exactly that one."""
    act = hf.get(key) or default
    if act not in allowed:
        raise ValueError(f"unsupported {key} {act!r}: supported are {list(allowed)}")
    return act


def rope_theta(hf: dict[str, Any], kind: str | None, legacy: str, default: float) -> float:
    """A rotary base from transformers 5's rope_parameters (per layer kind or flat), else
    from the older flat key; any rope_type but "default" is refused by name."""
    if hf.get("rope_scaling"):
        raise ValueError(f"unsupported rope_scaling {hf['rope_scaling']!r}: only plain rotary is")
    params = hf.get("rope_parameters") or {}
    if kind is not None:
        params = params.get(kind) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r}: only 'default' rotary is")
    return float(params.get("rope_theta", hf.get(legacy, default)))


# The attention of the Llama lineage (Gemma 3, Qwen3): q/k/v/o projections and q/k RMSNorms,
# by their names in transformers' checkpoints -> ours.
GQA_ATTENTION = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.out_proj",
    "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm",
}
