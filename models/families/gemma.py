"""Gemma 3 text as a bidirectional encoder (EmbeddingGemma: Gemma3TextModel with
`use_bidirectional_attention: true`).

Sandwich norms of RMSNorm with a (1 + w) scale, grouped-query attention with RMS-normed q and
k, scores divided by √query_pre_attn_scalar, gelu-tanh-gated MLP, token vectors scaled by
√d_model, no embedding norm, a final norm. Layers are global or sliding per `layer_types`
(older configs: every sliding_window_pattern-th layer is global); global layers rotate with
rope_theta, sliding ones with rope_local_base_freq. Bidirectional sliding layers see
|i - j| <= sliding_window // 2 (transformers' mask for this flag, checked in the tests).
"""

from __future__ import annotations

import re
from typing import Any

from models.families.base import GQA_ATTENTION, Family, check_act, rope_theta


def layer_types(hf: dict[str, Any], n_layers: int) -> list[str]:
    pattern = hf.get("sliding_window_pattern", 6)
    default = [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)
    ]
    return hf.get("layer_types") or default


def _config(hf: dict[str, Any]) -> dict[str, Any]:
    if not hf.get("use_bidirectional_attention"):
        raise ValueError(
            "unsupported causal Gemma 3: headwise serves it as an encoder, which needs "
            "use_bidirectional_attention: true (as EmbeddingGemma)"
        )
    check_act(hf, "hidden_activation", ("gelu_pytorch_tanh",), "gelu_pytorch_tanh")
    if hf.get("attn_logit_softcapping") is not None:
        # transformers' Gemma3Attention stores it but never applies it; Gemma 3 leaves it null.
        raise ValueError("unsupported Gemma 3 attn_logit_softcapping: transformers ignores it")
    n_layers = hf["num_hidden_layers"]
    types = layer_types(hf, n_layers)
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"],
        "n_layers": n_layers,
        "d_ff": hf["intermediate_size"],
        "max_positions": hf.get("max_position_embeddings", 131_072),
        "type_vocab_size": 0,
        "layer_norm_eps": hf.get("rms_norm_eps", 1e-6),
        "dropout": 0.0,
        "attn_dropout": hf.get("attention_dropout") or 0.0,
        "positions": "rotary",
        "norm": "sandwich",
        "pad_token_id": hf.get("pad_token_id", 0),
        "architecture": "gemma3",
        "head_dim": hf.get("head_dim", 256),
        "n_kv_heads": hf.get("num_key_value_heads", 4),
        "scale_dim": hf.get("query_pre_attn_scalar", 256),
        "qk_norm": True,
        "rotary_theta": rope_theta(hf, "full_attention", "rope_theta", 1_000_000.0),
        "local_rotary_theta": rope_theta(hf, "sliding_attention", "rope_local_base_freq", 1e4),
        "local_window": hf.get("sliding_window", 4096) // 2,
        "local_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        "norm_kind": "rms_offset",
        "ffn_kind": "geglu_tanh",
        "attn_bias": hf.get("attention_bias", False),
        "ffn_bias": False,
        "embedding_norm": False,
        "scale_embeddings": True,
    }


GEMMA3 = Family(
    architecture="gemma3",
    model_types=("gemma3_text",),
    prefix="model.",
    config=_config,
    exact={"embed_tokens": "encoder.embeddings.tokens", "norm": "encoder.final_norm"},
    layer_prefix="layers",
    layer={
        "input_layernorm": "norm1",
        **GQA_ATTENTION,
        "post_attention_layernorm": "post_attn_norm",
        "pre_feedforward_layernorm": "norm2",
        "post_feedforward_layernorm": "post_ffn_norm",
        "mlp.gate_proj": "ffn.gate",
        "mlp.up_proj": "ffn.up",
        "mlp.down_proj": "ffn.down",
    },
    head={},
    head_kind=None,  # Gemma3ForSequenceClassification (last-token score) is not reproduced
    ignored=re.compile(r"^(lm_head\.|rotary_emb\.)"),
)
