"""EncoderConfig: every architectural number of the encoder, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

Positions = Literal["learned", "sinusoidal"]
NormPlacement = Literal["post", "pre"]
Pooling = Literal["mean", "cls"]
AttentionImpl = Literal["explicit", "sdpa"]


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    attn_dropout: float = 0.1
    positions: Positions = "learned"
    norm: NormPlacement = "post"
    pooling: Pooling = "mean"
    pad_token_id: int = 0
    # "explicit" computes softmax(QKᵀ/√d_k + mask)·V step by step (the reference, and the graph
    # shape ONNX Runtime fuses); "sdpa" calls torch's fused kernel. Weights always use explicit.
    attention_impl: AttentionImpl = "explicit"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        choices = {
            "positions": ("learned", "sinusoidal"),
            "norm": ("post", "pre"),
            "pooling": ("mean", "cls"),
            "attention_impl": ("explicit", "sdpa"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> EncoderConfig:
        """Build from a Hugging Face BERT-family config.json."""
        act = hf.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new", "gelu_python"):
            raise ValueError(f"unsupported hidden_act {act!r}: only GELU encoders are supported")
        pos_type = hf.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ValueError(f"unsupported position_embedding_type {pos_type!r}")
        values: dict[str, Any] = {
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
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> EncoderConfig:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return EncoderConfig(**values)
