"""The checkpoint families: how each one's config.json and tensor names map onto our encoder.

Everything that tells the families apart lives here, as data (one module per group of
families): config translation, tensor-name rules, the classification head's layout. The model
code is the same for all of them (models/encoder.py), configured by EncoderConfig.
"""

from __future__ import annotations

from typing import Any

from models.config import EncoderConfig
from models.families.base import Family
from models.families.bert import BERT, DISTILBERT, MPNET, ROBERTA
from models.families.deberta import DEBERTA_V2
from models.families.gemma import GEMMA3
from models.families.modernbert import MODERNBERT
from models.families.nomic import NOMIC, NOMIC_REMOTE
from models.families.qwen3 import QWEN3

FAMILIES = (
    BERT,
    ROBERTA,
    DISTILBERT,
    MPNET,
    MODERNBERT,
    NOMIC,
    NOMIC_REMOTE,
    GEMMA3,
    DEBERTA_V2,
    QWEN3,
)


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a config.json, by its model_type (BERT when a bare config lacks one) and,
    where one model_type has two config dialects, by which one it is written in."""
    model_type = hf.get("model_type", "bert")
    for family in FAMILIES:
        if model_type in family.model_types and family.dialect(hf):
            return family
    known = sorted({t for f in FAMILIES for t in f.model_types})
    raise ValueError(f"unsupported model_type {model_type!r}: supported are {known}")


# A pruned checkpoint's config.json (export/prune.py) says what stays of each layer.
PRUNING_KEY = "headwise_pruning"


def encoder_config(hf: dict[str, Any], **overrides: Any) -> EncoderConfig:
    """The EncoderConfig of a Hugging Face config.json of any supported family."""
    pruned = hf.get(PRUNING_KEY) or {}
    kept = {
        "kept_heads": tuple(tuple(layer) for layer in pruned.get("kept_heads", ())),
        "ffn_sizes": tuple(pruned.get("ffn_sizes", ())),
    }
    return EncoderConfig(**{**family_of(hf).config(hf), **kept, **overrides})


__all__ = [
    "PRUNING_KEY",
    "BERT",
    "DEBERTA_V2",
    "DISTILBERT",
    "FAMILIES",
    "GEMMA3",
    "MODERNBERT",
    "MPNET",
    "NOMIC",
    "NOMIC_REMOTE",
    "QWEN3",
    "ROBERTA",
    "Family",
    "encoder_config",
    "family_of",
]
