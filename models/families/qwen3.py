"""Qwen3 as a decoder (Qwen3-Embedding, Qwen3-Reranker, Qwen3 score heads).

A pre-norm stack of RMSNorms (x / √(mean(x²) + ε) · w), causal grouped-query attention whose
q and k are RMS-normed per head before rotary (base rope_theta), scores over √head_dim, a
SwiGLU MLP, no biases (unless attention_bias), no embedding norm, a final norm. TEI serves it
causal unless `use_bidirectional_attention`, and so does this entry; sliding-window layers
(use_sliding_window) are refused by name.

Checkpoints come as Qwen3Model (no prefix: Qwen3-Embedding), Qwen3ForCausalLM (`model.` and an
lm_head, tied to the embedding table when tie_word_embeddings: Qwen3-Reranker) or
Qwen3ForSequenceClassification (`model.` and a bias-free `score` head, pooled at the last token
that is not the pad token, as transformers pools it).
"""

from __future__ import annotations

import re
from typing import Any

from models.config import Pooling
from models.families.base import GQA_ATTENTION, Family, check_act, rope_theta


def _config(hf: dict[str, Any]) -> dict[str, Any]:
    check_act(hf, "hidden_act", ("silu",), "silu")
    n_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["full_attention"] * n_layers
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in types):
        raise ValueError(
            "unsupported Qwen3 sliding-window layers (use_sliding_window / layer_types): "
            "headwise serves Qwen3 with full causal attention on every layer"
        )
    heads = hf["num_attention_heads"]
    pad = hf.get("pad_token_id")
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["hidden_size"],
        "n_heads": heads,
        "n_layers": n_layers,
        "d_ff": hf["intermediate_size"],
        "max_positions": hf.get("max_position_embeddings", 32_768),
        "type_vocab_size": 0,
        "layer_norm_eps": hf.get("rms_norm_eps", 1e-6),
        "dropout": 0.0,
        "attn_dropout": hf.get("attention_dropout") or 0.0,
        "positions": "rotary",
        "norm": "pre",
        # Padding is masked, never looked up: any id in the vocabulary pads (transformers'
        # configs often leave pad_token_id null).
        "pad_token_id": pad if pad is not None else 0,
        "architecture": "qwen3",
        "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "qk_norm": True,
        "causal": not hf.get("use_bidirectional_attention", False),
        "rotary_theta": rope_theta(hf, None, "rope_theta", 1_000_000.0),
        "norm_kind": "rms",
        "ffn_kind": "swiglu",
        "attn_bias": bool(hf.get("attention_bias", False)),
        "ffn_bias": False,
        "embedding_norm": False,
    }


def _last_token(hf: dict[str, Any]) -> Pooling:
    return "lasttoken"


QWEN3 = Family(
    architecture="qwen3",
    model_types=("qwen3",),
    prefix="model.",
    config=_config,
    exact={"embed_tokens": "encoder.embeddings.tokens", "norm": "encoder.final_norm"},
    layer_prefix="layers",
    layer={
        "input_layernorm": "norm1",
        **GQA_ATTENTION,
        "post_attention_layernorm": "norm2",
        "mlp.gate_proj": "ffn.gate",
        "mlp.up_proj": "ffn.up",
        "mlp.down_proj": "ffn.down",
    },
    head={"score": "out"},
    head_kind="linear",
    ignored=re.compile(r"^(lm_head\.|rotary_emb\.)"),
    head_pooling=_last_token,
)
