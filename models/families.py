"""The checkpoint families: how each one's config.json and tensor names map onto our encoder.

Everything that tells BERT, RoBERTa, XLM-RoBERTa, DistilBERT and MPNet apart lives here, as
data: config translation, tensor-name rules, the classification head's layout. The model code
is the same for all of them (models/encoder.py), configured by EncoderConfig.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.config import EncoderConfig, HeadKind

GELU = ("gelu", "gelu_python")


@dataclass(frozen=True)
class Family:
    architecture: str  # our name, recorded in the manifest
    model_types: tuple[str, ...]  # config.json "model_type" values
    prefix: str  # the base model's prefix inside task checkpoints ("roberta.")
    config: Callable[[dict[str, Any]], dict[str, Any]]  # config.json -> EncoderConfig values
    exact: dict[str, str]  # whole names (after the prefix)
    layer_prefix: str  # "encoder.layer" / "transformer.layer"
    layer: dict[str, str]  # inside one layer
    head: dict[str, str]  # classification-head modules, as named in the checkpoint
    head_kind: HeadKind
    ignored: re.Pattern[str] = field(
        default=re.compile(
            r"^(pooler\.|cls\.|lm_head\.|embeddings\.(position_ids|token_type_ids)$)"
        )
    )

    def to_ours(self, name: str, with_head: bool) -> str | None:
        """One checkpoint tensor name -> ours; None for one we deliberately skip."""
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
        m = re.match(rf"^{re.escape(self.layer_prefix)}\.(\d+)\.(.+)$", stem)
        if m and m.group(2) in self.layer:
            return f"encoder.layers.{m.group(1)}.{self.layer[m.group(2)]}.{kind}"
        return name  # unknown: reported as unexpected

    def is_head(self, name: str) -> bool:
        return any(name.startswith(h + ".") for h in self.head)


def _check_act(hf: dict[str, Any], key: str = "hidden_act") -> None:
    act = hf.get(key, "gelu")
    if act not in GELU:
        raise ValueError(f"unsupported {key} {act!r}: only exact-GELU encoders are supported")


def _bert_like(hf: dict[str, Any]) -> dict[str, Any]:
    """BERT's config.json keys; RoBERTa, XLM-RoBERTa and MPNet reuse them."""
    _check_act(hf)
    pos_type = hf.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ValueError(f"unsupported position_embedding_type {pos_type!r}")
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"],
        "n_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"],
        "max_positions": hf.get("max_position_embeddings", 512),
        "type_vocab_size": hf.get("type_vocab_size", 2),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "dropout": hf.get("hidden_dropout_prob", 0.1),
        "attn_dropout": hf.get("attention_probs_dropout_prob", 0.1),
        "pad_token_id": hf.get("pad_token_id", 0) or 0,
    }


def _roberta(hf: dict[str, Any]) -> dict[str, Any]:
    values = _bert_like(hf)
    pad = hf.get("pad_token_id", 1)
    arch = "xlm-roberta" if hf.get("model_type") == "xlm-roberta" else "roberta"
    return {**values, "pad_token_id": pad, "position_offset": pad + 1, "architecture": arch}


def _mpnet(hf: dict[str, Any]) -> dict[str, Any]:
    values = _bert_like({**hf, "type_vocab_size": 0})
    pad = hf.get("pad_token_id", 1)
    return {
        **values,
        "pad_token_id": pad,
        "position_offset": pad + 1,
        "relative_attention_buckets": hf.get("relative_attention_num_buckets", 32),
        "architecture": "mpnet",
    }


def _distilbert(hf: dict[str, Any]) -> dict[str, Any]:
    _check_act(hf, "activation")
    if hf.get("sinusoidal_pos_embds"):
        raise ValueError("unsupported DistilBERT with sinusoidal_pos_embds")
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["dim"],
        "n_heads": hf["n_heads"],
        "n_layers": hf["n_layers"],
        "d_ff": hf["hidden_dim"],
        "max_positions": hf.get("max_position_embeddings", 512),
        "type_vocab_size": 0,
        "layer_norm_eps": 1e-12,  # fixed in DistilBERT's code, not in its config
        "dropout": hf.get("dropout", 0.1),
        "attn_dropout": hf.get("attention_dropout", 0.1),
        "pad_token_id": hf.get("pad_token_id", 0) or 0,
        "architecture": "distilbert",
    }


_EMBEDDINGS = {
    "embeddings.word_embeddings": "encoder.embeddings.tokens",
    "embeddings.position_embeddings": "encoder.embeddings.positions",
    "embeddings.token_type_embeddings": "encoder.embeddings.token_types",
    "embeddings.LayerNorm": "encoder.embeddings.norm",
}
_BERT_LAYER = {
    "attention.self.query": "attn.q_proj",
    "attention.self.key": "attn.k_proj",
    "attention.self.value": "attn.v_proj",
    "attention.output.dense": "attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "norm2",
}
_ROBERTA_HEAD = {"classifier.dense": "dense", "classifier.out_proj": "out"}

BERT = Family(
    architecture="bert",
    model_types=("bert",),
    prefix="bert.",
    config=lambda hf: {**_bert_like(hf), "architecture": "bert"},
    exact=_EMBEDDINGS,
    layer_prefix="encoder.layer",
    layer=_BERT_LAYER,
    head={"bert.pooler.dense": "dense", "classifier": "out"},
    head_kind="pooler_tanh",
)
ROBERTA = Family(
    architecture="roberta",
    model_types=("roberta", "xlm-roberta"),
    prefix="roberta.",
    config=_roberta,
    exact=_EMBEDDINGS,
    layer_prefix="encoder.layer",
    layer=_BERT_LAYER,
    head=_ROBERTA_HEAD,
    head_kind="dense_tanh",
)
DISTILBERT = Family(
    architecture="distilbert",
    model_types=("distilbert",),
    prefix="distilbert.",
    config=_distilbert,
    exact=_EMBEDDINGS,
    layer_prefix="transformer.layer",
    layer={
        "attention.q_lin": "attn.q_proj",
        "attention.k_lin": "attn.k_proj",
        "attention.v_lin": "attn.v_proj",
        "attention.out_lin": "attn.out_proj",
        "sa_layer_norm": "norm1",
        "ffn.lin1": "ffn.fc1",
        "ffn.lin2": "ffn.fc2",
        "output_layer_norm": "norm2",
    },
    head={"pre_classifier": "dense", "classifier": "out"},
    head_kind="dense_relu",
    ignored=re.compile(r"^(vocab_transform|vocab_layer_norm|vocab_projector)\.|position_ids$"),
)
MPNET = Family(
    architecture="mpnet",
    model_types=("mpnet",),
    prefix="mpnet.",
    config=_mpnet,
    exact={
        **_EMBEDDINGS,
        "encoder.relative_attention_bias": "encoder.relative_bias.table",
    },
    layer_prefix="encoder.layer",
    layer={
        "attention.attn.q": "attn.q_proj",
        "attention.attn.k": "attn.k_proj",
        "attention.attn.v": "attn.v_proj",
        "attention.attn.o": "attn.out_proj",
        "attention.LayerNorm": "norm1",
        "intermediate.dense": "ffn.fc1",
        "output.dense": "ffn.fc2",
        "output.LayerNorm": "norm2",
    },
    head=_ROBERTA_HEAD,
    head_kind="dense_tanh",
)
FAMILIES = (BERT, ROBERTA, DISTILBERT, MPNET)


def family_of(hf: dict[str, Any]) -> Family:
    """The family of a config.json, by its model_type (BERT when a bare config lacks one)."""
    model_type = hf.get("model_type", "bert")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = sorted(t for f in FAMILIES for t in f.model_types)
    raise ValueError(f"unsupported model_type {model_type!r}: supported are {known}")


def encoder_config(hf: dict[str, Any], **overrides: Any) -> EncoderConfig:
    """The EncoderConfig of a Hugging Face config.json of any supported family."""
    return EncoderConfig(**{**family_of(hf).config(hf), **overrides})
