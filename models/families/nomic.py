"""NomicBERT (nomic-embed-text): post-norm BERT with rotary positions and SwiGLU, in two
dialects that share model_type "nomic_bert".

Config dialects:
- transformers 5's own `nomic_bert` (NomicBertModel): BERT-style keys (hidden_size, …),
  bias-free attention and SwiGLU, full-width rotary with rope_parameters.rope_theta;
  rope_type "dynamic" is NTK scaling past max_position_embeddings, and the input limit is then
  stretched by `factor`.
- the remote code nomic-ai/nomic-embed-text-v1.5 publishes (GPT2Config keys: n_embd, n_head,
  n_layer, n_inner, rotary_emb_fraction, rotary_emb_base, rotary_scaling_factor,
  max_trained_positions, qkv_proj_bias, mlp_fc1_bias, …). Its gated MLP rounds n_inner up to
  a multiple of 256. Dynamic NTK past max_trained_positions uses the remote code's formula,
  computed afresh for each input (the remote code caches the last length's base, so its
  output depends on call history).

Tensor layouts, read under either dialect: the remote code's (encoder.layers.N.attn.Wqkv,
mlp.fc11 = up, mlp.fc12 = gate, mlp.fc2, norm1, norm2, emb_ln), which transformers 5 also
writes on save_pretrained, and transformers' in-memory names (layers.N.self_attn.q_proj, …).
"""

from __future__ import annotations

import re
from typing import Any

from models.families.base import Family, check_act

# Remote-code switches headwise does not reproduce, with the value it does.
REMOTE_FIXED = {
    "prenorm": False,
    "parallel_block": False,
    "causal": False,
    "rotary_emb_interleaved": False,
    "use_rms_norm": False,
}
REMOTE_FFN = ("swiglu", "geglu")  # the gated MLPs: y = fc11(x) · act(fc12(x))


def is_remote(hf: dict[str, Any]) -> bool:
    return "n_embd" in hf


def _config(hf: dict[str, Any]) -> dict[str, Any]:
    check_act(hf, "hidden_act", ("silu", "swish"), "silu")
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "dynamic"):
        raise ValueError(f"unsupported rope_type {rope_type!r}: supported are default, dynamic")
    factor = float(params["factor"]) if rope_type == "dynamic" else 0.0
    trained = hf.get("max_position_embeddings", 2048)
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"],
        "n_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"],
        "max_positions": int(trained * factor) if factor else trained,
        "type_vocab_size": hf.get("type_vocab_size", 2),
        "layer_norm_eps": hf.get("layer_norm_eps", 1e-12),
        "dropout": hf.get("hidden_dropout_prob", 0.0),
        "attn_dropout": hf.get("attention_probs_dropout_prob", 0.0),
        "positions": "rotary",
        "norm": "post",
        "pad_token_id": hf.get("pad_token_id") or 0,
        "architecture": "nomic-bert",
        "head_dim": hf.get("head_dim") or 0,
        "rotary_theta": float(params.get("rope_theta", hf.get("rope_theta", 1000.0))),
        "rotary_scaling_factor": factor,
        "rotary_trained_length": trained if factor else 0,
        "ffn_kind": "swiglu",
        "attn_bias": False,
        "ffn_bias": False,
    }


def _remote_config(hf: dict[str, Any]) -> dict[str, Any]:
    for key, value in REMOTE_FIXED.items():
        if bool(hf.get(key, value)) != value:
            raise ValueError(f"unsupported NomicBERT {key}={hf[key]!r}: headwise needs {value}")
    if hf.get("rotary_emb_scale_base") is not None:
        raise ValueError("unsupported NomicBERT rotary_emb_scale_base (xPos)")
    if hf.get("num_heads_kv") not in (None, hf["n_head"]):
        raise ValueError("unsupported NomicBERT num_heads_kv: grouped heads in the remote code")
    if hf.get("mlp_fc1_bias", True) != hf.get("mlp_fc2_bias", True):
        raise ValueError("unsupported NomicBERT with mlp_fc1_bias != mlp_fc2_bias")
    fraction = hf.get("rotary_emb_fraction", 0.0)
    if fraction <= 0:
        raise ValueError("unsupported NomicBERT without rotary (rotary_emb_fraction 0)")
    ffn = check_act(hf, "activation_function", REMOTE_FFN, "gelu")
    d, multiple = hf["n_embd"], hf.get("pad_vocab_size_multiple", 1)
    # The remote gated MLP rounds its hidden size up to a multiple of 256.
    inner = -(-(hf.get("n_inner") or int(8 * d / 3)) // 256) * 256
    factor = float(hf.get("rotary_scaling_factor") or 0.0)
    return {
        "vocab_size": -(-hf["vocab_size"] // multiple) * multiple,
        "d_model": d,
        "n_heads": hf["n_head"],
        "n_layers": hf["n_layer"],
        "d_ff": inner,
        "max_positions": hf.get("n_positions", 2048),
        "type_vocab_size": hf.get("type_vocab_size", 2),
        "layer_norm_eps": hf.get("layer_norm_epsilon", 1e-5),
        "dropout": hf.get("resid_pdrop", 0.0),
        "attn_dropout": hf.get("attn_pdrop", 0.0),
        "positions": "rotary",
        "norm": "post",
        "pad_token_id": hf.get("pad_token_id") or 0,
        "architecture": "nomic-bert",
        "rotary_theta": float(hf.get("rotary_emb_base", 10_000)),
        "rotary_fraction": fraction,
        "rotary_scaling_factor": factor,
        "rotary_trained_length": hf.get("max_trained_positions", 2048) if factor else 0,
        "ffn_kind": ffn,
        "attn_bias": hf.get("qkv_proj_bias", True),  # Wqkv and out_proj alike
        "ffn_bias": hf.get("mlp_fc1_bias", True),
    }


# Both tensor layouts, remote first: one table serves both config dialects.
_EXACT = {
    "embeddings.word_embeddings": "encoder.embeddings.tokens",
    "embeddings.token_type_embeddings": "encoder.embeddings.token_types",
    "emb_ln": "encoder.embeddings.norm",
    "embeddings.LayerNorm": "encoder.embeddings.norm",
}
_LAYER: dict[str, str | tuple[str, ...]] = {
    "attn.Wqkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "attn.out_proj": "attn.out_proj",
    "norm1": "norm1",
    "mlp.fc11": "ffn.up",  # y = fc11(x) · act(fc12(x))
    "mlp.fc12": "ffn.gate",
    "mlp.fc2": "ffn.down",
    "norm2": "norm2",
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.out_proj",
    "post_attention_layernorm": "norm1",
    "mlp.up_proj": "ffn.up",
    "mlp.gate_proj": "ffn.gate",
    "mlp.down_proj": "ffn.down",
    "post_mlp_layernorm": "norm2",
}
_LAYER_PREFIX = ("encoder.layers", "layers")
_IGNORED = re.compile(
    r"^(pooler\.|cls\.|lm_head\.|rotary_emb\.|embeddings\.(position_ids|token_type_ids)$)"
)

NOMIC = Family(
    architecture="nomic-bert",
    model_types=("nomic_bert",),
    prefix="nomic_bert.",
    config=_config,
    exact=_EXACT,
    layer_prefix=_LAYER_PREFIX,
    layer=_LAYER,
    head={"nomic_bert.pooler.dense": "dense", "classifier": "out"},
    head_kind="pooler_tanh",
    dialect=lambda hf: not is_remote(hf),
    ignored=_IGNORED,
)
NOMIC_REMOTE = Family(
    architecture="nomic-bert",
    model_types=("nomic_bert",),
    prefix="bert.",
    config=_remote_config,
    exact=_EXACT,
    layer_prefix=_LAYER_PREFIX,
    layer=_LAYER,
    head={},
    head_kind=None,  # the remote code's classifier is not reproduced
    dialect=is_remote,
    ignored=_IGNORED,
)
