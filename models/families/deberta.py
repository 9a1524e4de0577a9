"""DeBERTa-v2 and -v3 (model_type "deberta-v2"): post-norm BERT whose attention adds
disentangled relative-position terms (models/disentangled.py).

deberta-v3 configs: relative_attention, position_buckets 256, norm_rel_ebd "layer_norm",
share_att_key, pos_att_type "p2c|c2p", position_biased_input false (no absolute positions),
type_vocab_size 0. Scores are divided by √(d_k · (1 + number of c2p/p2c terms)). The
classification head is the ContextPooler: first token -> dense -> GELU -> classifier.
"""

from __future__ import annotations

import re
from typing import Any

from models.families.base import Family, check_act
from models.families.bert import GELU


def _terms(hf: dict[str, Any]) -> tuple[str, ...]:
    pos_att = hf.get("pos_att_type") or []
    if isinstance(pos_att, str):
        pos_att = [t.strip() for t in pos_att.lower().split("|")]
    unknown = set(pos_att) - {"c2p", "p2c"}
    if unknown:
        raise ValueError(f"unsupported pos_att_type {sorted(unknown)}: supported are c2p, p2c")
    return tuple(t for t in ("c2p", "p2c") if t in pos_att)


def _config(hf: dict[str, Any]) -> dict[str, Any]:
    check_act(hf, "hidden_act", GELU, "gelu")
    check_act(hf, "pooler_hidden_act", ("gelu",), "gelu")
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    for key in ("embedding_size", "pooler_hidden_size"):
        if hf.get(key, d) != d:
            raise ValueError(f"unsupported DeBERTa {key} {hf[key]} != hidden_size {d}")
    if hf.get("conv_kernel_size", 0) > 0:
        raise ValueError("unsupported DeBERTa conv_kernel_size: the first layer's ConvLayer")
    if hf.get("attention_head_size", d // heads) != d // heads:
        raise ValueError("unsupported DeBERTa attention_head_size != hidden_size / heads")
    terms = _terms(hf)
    relative = bool(hf.get("relative_attention", False))
    if relative != bool(terms):
        raise ValueError("unsupported DeBERTa: relative_attention without c2p/p2c, or the reverse")
    max_relative = hf.get("max_relative_positions", -1)
    if max_relative < 1:
        max_relative = hf.get("max_position_embeddings", 512)
    norm_rel = [x.strip() for x in (hf.get("norm_rel_ebd") or "none").lower().split("|")]
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": d,
        "n_heads": heads,
        "n_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"],
        "max_positions": hf.get("max_position_embeddings", 512),
        "type_vocab_size": hf.get("type_vocab_size", 0),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-7),
        "dropout": hf.get("hidden_dropout_prob", 0.1),
        "attn_dropout": hf.get("attention_probs_dropout_prob", 0.1),
        "positions": "learned" if hf.get("position_biased_input", True) else "none",
        "norm": "post",
        "pad_token_id": hf.get("pad_token_id") or 0,
        "architecture": "deberta-v2",
        "scale_dim": d // heads * (1 + len(terms)),
        "disentangled": terms,
        "position_buckets": max(hf.get("position_buckets", -1), 0),
        "max_relative_positions": max_relative,
        "share_att_key": bool(hf.get("share_att_key", False)),
        "norm_rel_embeddings": "layer_norm" in norm_rel,
    }


DEBERTA_V2 = Family(
    architecture="deberta-v2",
    model_types=("deberta-v2",),
    prefix="deberta.",
    config=_config,
    exact={
        "embeddings.word_embeddings": "encoder.embeddings.tokens",
        "embeddings.position_embeddings": "encoder.embeddings.positions",
        "embeddings.token_type_embeddings": "encoder.embeddings.token_types",
        "embeddings.LayerNorm": "encoder.embeddings.norm",
        "encoder.rel_embeddings": "encoder.relative.table",
        "encoder.LayerNorm": "encoder.relative.norm",
    },
    layer_prefix="encoder.layer",
    layer={
        "attention.self.query_proj": "attn.q_proj",
        "attention.self.key_proj": "attn.k_proj",
        "attention.self.value_proj": "attn.v_proj",
        "attention.self.pos_key_proj": "attn.relative.pos_key_proj",
        "attention.self.pos_query_proj": "attn.relative.pos_query_proj",
        "attention.output.dense": "attn.out_proj",
        "attention.output.LayerNorm": "norm1",
        "intermediate.dense": "ffn.fc1",
        "output.dense": "ffn.fc2",
        "output.LayerNorm": "norm2",
    },
    head={"pooler.dense": "dense", "classifier": "out"},
    head_kind="dense_gelu",
    ignored=re.compile(
        r"^(cls\.|lm_predictions\.|mask_predictions\.|embeddings\.(position_ids|token_type_ids)$)"
    ),
    # deberta-v3 checkpoints keep an absolute position table that position_biased_input=false
    # never reads (transformers drops it on load too).
    unused=re.compile(r"^encoder\.embeddings\.positions\."),
)
