"""Transformer encoder: embeddings, N × (attention + FFN, residual, LayerNorm), pooling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.pooling import POOLERS
from models.positions import RelativePositionBias, position_ids, sinusoidal_table


class Embeddings(nn.Module):
    """token + position (+ token-type) embeddings, then LayerNorm and dropout (as BERT)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        if cfg.positions == "learned":
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_positions, cfg.d_model))
        self.token_types = (
            nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        )
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.learned = cfg.positions == "learned"
        self.position_offset = cfg.position_offset
        self.pad_token_id = cfg.pad_token_id

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        x = self.tokens(input_ids)  # (B, N, d)
        pos = position_ids(input_ids, self.position_offset, self.pad_token_id)  # (1 or B, N)
        x = x + (self.positions(pos) if self.learned else self.sinusoid[pos])
        if self.token_types is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)  # every token is of type 0
            x = x + self.token_types(token_type_ids)
        return self.dropout(self.norm(x))


class FeedForward(nn.Module):
    """Position-wise FFN: GELU(x W_1 + b_1) W_2 + b_2."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderLayer(nn.Module):
    """Post-LN (BERT): x = LN(x + Attn(x)); x = LN(x + FFN(x)). Pre-LN: x = x + Attn(LN(x)) …"""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(
            cfg.d_model, cfg.n_heads, dropout=cfg.attn_dropout, impl=cfg.attention_impl
        )
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.norm == "pre"

    def forward(
        self, x: Tensor, mask: Tensor, need_weights: bool = False, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        if self.pre_norm:
            h = self.norm1(x)
            a, weights = self.attn(h, key_padding_mask=mask, need_weights=need_weights, bias=bias)
            x = x + self.dropout(a)
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            a, weights = self.attn(x, key_padding_mask=mask, need_weights=need_weights, bias=bias)
            x = self.norm1(x + self.dropout(a))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x, weights


@dataclass
class EncoderOutput:
    hidden: Tensor  # (B, N, d), last layer
    attentions: tuple[Tensor, ...] | None  # per layer (B, h, N, N), with need_weights


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        # MPNet: one relative-position bias, computed once and added in every layer.
        self.relative_bias = (
            RelativePositionBias(
                cfg.relative_attention_buckets, cfg.n_heads, cfg.relative_attention_max_distance
            )
            if cfg.relative_attention_buckets
            else None
        )
        # Pre-LN stacks end with one more LayerNorm; post-LN already ends normalised.
        self.final_norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids)  # (B, N, d)
        bias = None
        if self.relative_bias is not None:
            bias = self.relative_bias(input_ids.shape[1], input_ids.device)  # (1, h, N, N)
        attentions = []
        for layer in self.layers:
            x, weights = layer(x, attention_mask, need_weights=need_weights, bias=bias)
            if need_weights:
                attentions.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(x, tuple(attentions) if need_weights else None)


class SentenceEncoder(nn.Module):
    """Encoder + pooling (+ optional L2 normalisation): text ids -> one vector per text."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.pool = POOLERS[cfg.pooling]

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        normalize: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        out = self.encoder(input_ids, attention_mask, token_type_ids, need_weights=need_weights)
        pooled = self.pool(out.hidden, attention_mask)  # (B, d)
        if normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return pooled, out.attentions
