"""The BERT-shaped families: BERT, RoBERTa, XLM-RoBERTa, DistilBERT and MPNet.

Post-norm, learned absolute positions, exact-GELU FFN; what tells them apart is data: config
keys, position numbering, MPNet's relative bias, tensor names and the head's layout.
"""

from __future__ import annotations

import re
from typing import Any

from models.families.base import Family, Target, check_act

GELU = ("gelu", "gelu_python")


def _check_act(hf: dict[str, Any], key: str = "hidden_act") -> None:
    check_act(hf, key, GELU, "gelu")


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
_BERT_LAYER: dict[str, Target] = {
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
_BERT_MLM = {
    "dense": "cls.predictions.transform.dense",
    "norm": "cls.predictions.transform.LayerNorm",
    "decoder": "cls.predictions.decoder",
    "bias": "cls.predictions.bias",
}
_ROBERTA_MLM = {
    "dense": "lm_head.dense",
    "norm": "lm_head.layer_norm",
    "decoder": "lm_head.decoder",
    "bias": "lm_head.bias",
}

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
    mlm_head=_BERT_MLM,
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
    mlm_head=_ROBERTA_MLM,
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
    mlm_head={"dense": "vocab_transform", "norm": "vocab_layer_norm", "decoder": "vocab_projector"},
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
