"""EncoderConfig: every architectural number of the encoder, validated on construction.

One encoder serves every family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ModernBERT,
NomicBERT, Gemma 3 text, DeBERTa-v2/v3); what differs between them is named here, not written
as a second model:

- `position_offset`: 0 numbers positions 0..N-1 (BERT, DistilBERT). RoBERTa-style models
  (RoBERTa, XLM-RoBERTa, MPNet) number only the real tokens, starting after the padding index:
  position_offset = pad_token_id + 1, and padding tokens get position pad_token_id.
- `type_vocab_size`: 2 for BERT (token types tell a pair's two segments apart), 1 for RoBERTa
  (one type, always 0), 0 for models without the table (DistilBERT, MPNet).
- `relative_attention_buckets`: MPNet adds a learned per-head bias, indexed by the bucketed
  distance between query and key, to every layer's attention scores; 0 for none.
- `positions`: absolute "learned" or "sinusoidal" vectors added to the embeddings, "rotary"
  (q and k rotated by position: models/rotary.py), or "none" (DeBERTa-v3: relative only).
- `local_layers` attend within `local_window` tokens on either side (models/windows.py), with
  rotary base `local_rotary_theta`; the other layers are global, with `rotary_theta`.
- `norm`: "post" (BERT), "pre" (ModernBERT), "sandwich" (Gemma: pre-norm, and the sub-layer's
  output normed again before the residual add). Pre and sandwich stacks end with a final norm.
- `disentangled`: DeBERTa's c2p/p2c score terms (models/disentangled.py), with its
  `position_buckets`, `max_relative_positions`, `share_att_key` and LayerNorm'd table.
- `dense_layers`: sentence-transformers' Dense modules after pooling, (in, out, bias) each.
- `causal`: a decoder's self-attention (Qwen3): query i sees keys j <= i only. The stack is
  otherwise the same pre-norm one; models/decoder.py has the heads a decoder adds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

Positions = Literal["learned", "sinusoidal", "rotary", "none"]
NormPlacement = Literal["post", "pre", "sandwich"]
Pooling = Literal["mean", "cls", "lasttoken"]
AttentionImpl = Literal["explicit", "sdpa"]
Architecture = Literal[
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "nomic-bert",
    "gemma3",
    "deberta-v2",
    "qwen3",
    "clip",
    "siglip",
]
# A family's sequence-classification head, as its checkpoints lay it out (models/heads.py).
# "linear": one bias-free projection of the last token's vector (Qwen3ForSequenceClassification).
HeadKind = Literal[
    "pooler_tanh", "dense_tanh", "dense_relu", "dense_gelu", "dense_gelu_norm", "linear"
]

CHOICES = {
    "positions": ("learned", "sinusoidal", "rotary", "none"),
    "norm": ("post", "pre", "sandwich"),
    "norm_kind": ("layer", "rms", "rms_offset"),
    "ffn_kind": ("gelu", "gelu_tanh", "quick_gelu", "geglu", "geglu_tanh", "swiglu"),
    "pooling": ("mean", "cls", "lasttoken"),
    "attention_impl": ("explicit", "sdpa"),
    "architecture": get_args(Architecture),
}


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
    # --- heads: size, grouping, scale -----------------------------------------------------
    head_dim: int = 0  # 0: d_model // n_heads (Gemma states its own)
    n_kv_heads: int = 0  # 0: n_heads; fewer: grouped-query attention
    scale_dim: int = 0  # scores are divided by √scale_dim; 0: d_k
    attn_softcap: float = 0.0  # cap · tanh(score / cap); 0: none
    qk_norm: bool = False  # per-head norm of q and k (Gemma 3, Qwen3)
    causal: bool = False  # query i sees keys j <= i (a decoder: Qwen3)
    # --- rotary positions and local windows --------------------------------------------------
    rotary_theta: float = 10000.0
    local_rotary_theta: float = 0.0  # 0: rotary_theta
    rotary_fraction: float = 1.0  # of d_k that rotates
    rotary_scaling_factor: float = 0.0  # dynamic NTK past rotary_trained_length; 0: none
    rotary_trained_length: int = 0
    local_window: int = 0  # a local layer's query sees keys with |i - j| <= local_window
    local_layers: tuple[int, ...] = ()
    # --- norms, FFN, biases, embeddings -------------------------------------------------------
    norm_kind: Literal["layer", "rms", "rms_offset"] = "layer"
    norm_bias: bool = True  # LayerNorm's bias (ModernBERT has none)
    first_attn_norm: bool = True  # False: layer 0 has no attention norm (ModernBERT)
    ffn_kind: Literal["gelu", "gelu_tanh", "quick_gelu", "geglu", "geglu_tanh", "swiglu"] = "gelu"
    attn_bias: bool = True
    ffn_bias: bool = True
    head_dense_bias: bool = True  # the classification head's dense layer
    embedding_norm: bool = True
    scale_embeddings: bool = False  # token vectors · √d_model (Gemma)
    # --- DeBERTa's disentangled attention -----------------------------------------------------
    disentangled: tuple[str, ...] = ()  # ("c2p", "p2c"), or empty for none
    position_buckets: int = 0
    max_relative_positions: int = 0
    share_att_key: bool = False
    norm_rel_embeddings: bool = False
    # --- sentence-transformers Dense modules after pooling: (in, out, bias) -----------------
    dense_layers: tuple[tuple[int, int, bool], ...] = ()
    # --- pruning (models/pruning.py): what stays of each layer; empty: all of it ---------------
    kept_heads: tuple[tuple[int, ...], ...] = ()  # per layer, the original indices of its heads
    ffn_sizes: tuple[int, ...] = ()  # per layer, its FFN's neurons

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.head_dim and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        for name in (
            "type_vocab_size",
            "position_offset",
            "relative_attention_buckets",
            "head_dim",
            "n_kv_heads",
            "scale_dim",
            "local_window",
        ):
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
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")
        self._check_attention()
        self._check_pruning()

    def _check_pruning(self) -> None:
        if self.kept_heads:
            if len(self.kept_heads) != self.n_layers:
                raise ValueError(
                    f"kept_heads lists {len(self.kept_heads)} layers of {self.n_layers}"
                )
            for i, kept in enumerate(self.kept_heads):
                if (
                    not kept
                    or list(kept) != sorted(set(kept))
                    or not 0 <= kept[0] <= kept[-1] < self.n_heads
                ):
                    raise ValueError(
                        f"kept_heads[{i}] = {list(kept)}: one or more ascending head indices "
                        f"of {self.n_heads}"
                    )
        if self.ffn_sizes and (len(self.ffn_sizes) != self.n_layers or min(self.ffn_sizes) < 1):
            raise ValueError(
                f"ffn_sizes {list(self.ffn_sizes)}: one positive size per layer of {self.n_layers}"
            )

    def layer_heads(self) -> list[tuple[int, ...]]:
        """Per layer, the original indices of the heads it has (all, unless pruned)."""
        return list(self.kept_heads) or [tuple(range(self.n_heads))] * self.n_layers

    def layer_ffn(self, index: int) -> int:
        """Layer `index`'s FFN neurons (d_ff, unless pruned)."""
        return self.ffn_sizes[index] if self.ffn_sizes else self.d_ff

    def _check_attention(self) -> None:
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})"
            )
        if self.positions == "rotary" and int(self.d_k * self.rotary_fraction) % 2:
            raise ValueError(f"rotary_fraction {self.rotary_fraction} of d_k must be even")
        if self.rotary_scaling_factor and self.rotary_trained_length <= 0:
            raise ValueError("rotary_scaling_factor needs rotary_trained_length")
        bad = [i for i in self.local_layers if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(f"local_layers {bad} are not layers of {self.n_layers}")
        if self.local_layers and self.local_window <= 0:
            raise ValueError("local_layers need a local_window > 0")
        if self.causal and (self.local_layers or self.disentangled):
            raise ValueError(
                "causal attention with local windows or DeBERTa's terms is unsupported"
            )
        if self.attn_softcap and self.attention_impl == "sdpa":
            raise ValueError("attn_softcap needs attention_impl 'explicit'")
        if self.disentangled:
            if not set(self.disentangled) <= {"c2p", "p2c"}:
                raise ValueError(f"disentangled terms must be c2p/p2c, got {self.disentangled}")
            if self.kv_heads != self.n_heads:
                raise ValueError("disentangled attention with grouped kv heads is not supported")
            if self.relative_span <= 0:
                raise ValueError(
                    "disentangled attention needs position_buckets or max_relative_positions"
                )

    @property
    def d_k(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def relative_span(self) -> int:
        """DeBERTa's S: the table holds 2S relative embeddings."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def embedding_dim(self) -> int:
        """The sentence embedding's size: the last Dense module's output, else d_model."""
        return self.dense_layers[-1][1] if self.dense_layers else self.d_model

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
