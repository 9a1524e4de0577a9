"""ModernBERT (Warner et al. 2024): pre-norm, rotary, GeGLU, bias-free, alternating windows.

Layer i is global when i % global_attn_every_n_layers == 0 (transformers 5 writes the list as
`layer_types`), else local: `local_attention` is the window's full width, a query sees
local_attention // 2 keys on either side. Global layers rotate with global_rope_theta,
local ones with local_rope_theta (transformers 5: rope_parameters per layer type). Layer 0
has no attention norm (the embeddings are normed already); the stack ends with final_norm.
The classification head pools the first token or the mean (`classifier_pooling`), then
dense -> GELU -> LayerNorm -> classifier.
"""

from __future__ import annotations

import re
from typing import Any, cast

from models.config import Pooling
from models.families.base import Family, check_act, rope_theta

GEGLU = {"gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh"}


def layer_types(hf: dict[str, Any], n_layers: int) -> list[str]:
    every = hf.get("global_attn_every_n_layers", 3)
    default = ["sliding_attention" if i % every else "full_attention" for i in range(n_layers)]
    return hf.get("layer_types") or default


def _config(hf: dict[str, Any]) -> dict[str, Any]:
    act = check_act(hf, "hidden_activation", tuple(GEGLU), "gelu")
    check_act(hf, "classifier_activation", ("gelu",), "gelu")
    n_layers = hf["num_hidden_layers"]
    types = layer_types(hf, n_layers)
    return {
        "vocab_size": hf["vocab_size"],
        "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"],
        "n_layers": n_layers,
        "d_ff": hf["intermediate_size"],
        "max_positions": hf.get("max_position_embeddings", 8192),
        "type_vocab_size": 0,
        "layer_norm_eps": hf.get("norm_eps", 1e-5),
        "dropout": hf.get("mlp_dropout", 0.0),
        "attn_dropout": hf.get("attention_dropout", 0.0),
        "positions": "rotary",
        "norm": "pre",
        "pad_token_id": hf.get("pad_token_id", 50283),
        "architecture": "modernbert",
        "rotary_theta": rope_theta(hf, "full_attention", "global_rope_theta", 160_000.0),
        "local_rotary_theta": rope_theta(hf, "sliding_attention", "local_rope_theta", 10_000.0),
        "local_window": hf.get("local_attention", 128) // 2,
        "local_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        "norm_bias": hf.get("norm_bias", False),
        "first_attn_norm": False,
        "ffn_kind": GEGLU[act],
        "attn_bias": hf.get("attention_bias", False),
        "ffn_bias": hf.get("mlp_bias", False),
        "head_dense_bias": hf.get("classifier_bias", False),
    }


def _head_pooling(hf: dict[str, Any]) -> Pooling:
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise ValueError(f"unsupported classifier_pooling {pooling!r}: supported are cls, mean")
    return cast(Pooling, pooling)


MODERNBERT = Family(
    architecture="modernbert",
    model_types=("modernbert",),
    prefix="model.",
    config=_config,
    exact={
        "embeddings.tok_embeddings": "encoder.embeddings.tokens",
        "embeddings.norm": "encoder.embeddings.norm",
        "final_norm": "encoder.final_norm",
    },
    layer_prefix="layers",
    layer={
        "attn_norm": "norm1",
        "attn.Wqkv": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
        "attn.Wo": "attn.out_proj",
        "mlp_norm": "norm2",
        "mlp.Wi": ("ffn.gate", "ffn.up"),  # act(first half) * second half
        "mlp.Wo": "ffn.down",
    },
    head={"head.dense": "dense", "head.norm": "norm", "classifier": "out"},
    head_kind="dense_gelu_norm",
    head_pooling=_head_pooling,
    ignored=re.compile(r"^(decoder\.|lm_head\.|rotary_emb\.)"),
)
