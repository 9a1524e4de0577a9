"""EncoderConfig: every architectural number of the encoder, validated on construction.

One encoder serves every family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet); what differs
between them is named here, not written as a second model:

- `position_offset`: 0 numbers positions 0..N-1 (BERT, DistilBERT). RoBERTa-style models
  (RoBERTa, XLM-RoBERTa, MPNet) number only the real tokens, starting after the padding index:
  position_offset = pad_token_id + 1, and padding tokens get position pad_token_id.
- `type_vocab_size`: 2 for BERT (token types tell a pair's two segments apart), 1 for RoBERTa
  (one type, always 0), 0 for models without the table (DistilBERT, MPNet).
- `relative_attention_buckets`: MPNet adds a learned per-head bias, indexed by the bucketed
  distance between query and key, to every layer's attention scores; 0 for none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

Positions = Literal["learned", "sinusoidal"]
NormPlacement = Literal["post", "pre"]
Pooling = Literal["mean", "cls", "lasttoken"]
AttentionImpl = Literal["explicit", "sdpa"]
Architecture = Literal["bert", "roberta", "xlm-roberta", "distilbert", "mpnet"]
# A family's sequence-classification head, as its checkpoints lay it out (models/heads.py).
HeadKind = Literal["pooler_tanh", "dense_tanh", "dense_relu"]


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
    position_offset: int = 0
    relative_attention_buckets: int = 0
    relative_attention_max_distance: int = 128
    norm: NormPlacement = "post"
    pooling: Pooling = "mean"
    pad_token_id: int = 0
    architecture: Architecture = "bert"
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
        for name in ("type_vocab_size", "position_offset", "relative_attention_buckets"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.position_offset >= self.max_positions:
            raise ValueError(
                f"position_offset {self.position_offset} leaves no positions of {self.max_positions}"
            )
        for name in ("dropout", "attn_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        choices = {
            "positions": ("learned", "sinusoidal"),
            "norm": ("post", "pre"),
            "pooling": ("mean", "cls", "lasttoken"),
            "attention_impl": ("explicit", "sdpa"),
            "architecture": ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def token_types(self) -> bool:
        """Whether token types carry information (BERT pairs), i.e. the graph takes them."""
        return self.type_vocab_size > 1

    @property
    def max_length(self) -> int:
        """The longest input the position table allows (RoBERTa: 514 positions, 512 tokens)."""
        return self.max_positions - self.position_offset

    def replace(self, **changes: Any) -> EncoderConfig:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return EncoderConfig(**values)
