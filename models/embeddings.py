"""A token's first vector: its embedding (+ absolute position) (+ token type), normed.

BERT:        LN(E_tok[t] + E_pos[m] + E_type[s])
ModernBERT:  LN(E_tok[t])                     positions are rotary, inside attention
NomicBERT:   LN(E_tok[t] + E_type[s])         the same
Gemma 3:     E_tok[t] · √d_model              no norm: each layer norms its own input
DeBERTa-v3:  LN(E_tok[t])                     positions are relative, inside attention
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from models.config import EncoderConfig
from models.norms import make_norm
from models.positions import position_ids, sinusoidal_table


class Embeddings(nn.Module):
    sinusoid: Tensor  # a buffer, with sinusoidal positions

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.kind = cfg.positions
        if cfg.positions == "learned":
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_positions, cfg.d_model))
        self.token_types = (
            nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        )
        self.norm = (
            make_norm(cfg.norm_kind, cfg.d_model, cfg.layer_norm_eps, cfg.norm_bias)
            if cfg.embedding_norm
            else None
        )
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.dropout = nn.Dropout(cfg.dropout)
        self.position_offset = cfg.position_offset
        self.pad_token_id = cfg.pad_token_id

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        x = self.tokens(input_ids)  # (B, N, d)
        if self.scale != 1.0:
            x = x * self.scale
        if self.kind in ("learned", "sinusoidal"):
            pos = position_ids(input_ids, self.position_offset, self.pad_token_id)  # (1|B, N)
            x = x + (self.positions(pos) if self.kind == "learned" else self.sinusoid[pos])
        if self.token_types is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)  # every token is of type 0
            x = x + self.token_types(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        out: Tensor = self.dropout(x)
        return out
