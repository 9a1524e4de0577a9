"""Transformer encoder: embeddings, N × (attention + FFN, residual, norm), pooling.

A decoder (Qwen3) is the same pre-norm stack with causal self-attention (`cfg.causal`): every
layer's query i sees keys j <= i. Its heads are in models/decoder.py.

Which layers a family uses is configuration (models/config.py): where the norms sit
(post/pre/sandwich), which FFN, which positions; the per-input tables every layer shares
(rotary cos/sin, the local band, MPNet's bias, DeBERTa's relative embeddings) are computed once
per forward pass here and handed to each layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.disentangled import DisentangledScores, RelativeEmbeddings, relative_positions
from models.embeddings import Embeddings
from models.ffn import make_ffn
from models.norms import make_norm
from models.pooling import Pooling
from models.positions import RelativePositionBias
from models.rotary import rotary_dim, rotary_tables
from models.windows import window_mask


class EncoderLayer(nn.Module):
    """Post-norm (BERT):  x = N1(x + Attn(x));        x = N2(x + FFN(x))
    Pre-norm:             x = x + Attn(N1(x));        x = x + FFN(N2(x))
    Sandwich (Gemma):     x = x + N1'(Attn(N1(x)));   x = x + N2'(FFN(N2(x)))"""

    def __init__(self, cfg: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        eps, kind = cfg.layer_norm_eps, cfg.norm_kind
        relative = (
            DisentangledScores(
                cfg.d_model, cfg.n_heads, cfg.d_k, cfg.disentangled, cfg.share_att_key
            )
            if cfg.disentangled
            else None
        )
        # A pruned layer has fewer heads (models/pruning.py); each keeps its original index.
        self.kept = list(cfg.layer_heads()[index])
        self.slots = cfg.n_heads
        self.attn = MultiHeadAttention(
            cfg.d_model,
            len(self.kept),
            dropout=cfg.attn_dropout,
            bias=cfg.attn_bias,
            impl=cfg.attention_impl,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.d_k,
            scale_dim=cfg.scale_dim,
            softcap=cfg.attn_softcap,
            qk_norm=(lambda d: make_norm(kind, d, eps)) if cfg.qk_norm else None,
            relative=relative,
        )
        self.ffn = make_ffn(cfg.ffn_kind, cfg.d_model, cfg.layer_ffn(index), cfg.ffn_bias)

        def norm() -> nn.Module:
            return make_norm(kind, cfg.d_model, eps, cfg.norm_bias)

        self.norm1 = norm() if index > 0 or cfg.first_attn_norm else nn.Identity()
        self.norm2 = norm()
        if cfg.norm == "sandwich":
            self.post_attn_norm = norm()
            self.post_ffn_norm = norm()
        self.dropout = nn.Dropout(cfg.dropout)
        self.placement = cfg.norm
        self.local = index in cfg.local_layers
        self.causal = cfg.causal

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        need_weights: bool = False,
        bias: Tensor | None = None,
        head_gates: Tensor | None = None,
        **positional: tuple[Tensor, Tensor] | Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, N, d); mask (B, N) 1 = real token; head_gates (B, h); positional: window,
        rotary, relative. A pruned layer takes the gates of its heads, and its maps come back in
        every head's slot, a removed head's all zeros."""
        pruned = len(self.kept) < self.slots
        if pruned and head_gates is not None:
            head_gates = head_gates[:, self.kept]  # (B, h_kept)
        attend = dict(
            key_padding_mask=mask,
            causal=self.causal,
            need_weights=need_weights,
            bias=bias,
            head_gates=head_gates,
            **positional,
        )
        if self.placement == "post":
            a, weights = self.attn(x, **attend)
            x = self.norm1(x + self.dropout(a))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        elif self.placement == "pre":
            a, weights = self.attn(self.norm1(x), **attend)
            x = x + self.dropout(a)
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            a, weights = self.attn(self.norm1(x), **attend)
            x = x + self.dropout(self.post_attn_norm(a))
            x = x + self.dropout(self.post_ffn_norm(self.ffn(self.norm2(x))))
        if pruned and weights is not None:
            b, _, n_q, n_k = weights.shape
            slots = weights.new_zeros(b, self.slots, n_q, n_k)
            slots[:, self.kept] = weights  # (B, h, N_q, N_k)
            weights = slots
        return x, weights


@dataclass
class EncoderOutput:
    hidden: Tensor  # (B, N, d), last layer
    attentions: tuple[Tensor, ...] | None  # per layer (B, h, N, N), with need_weights


class Encoder(nn.Module):
    """embeddings: what turns the inputs into the first vectors (default: tokens, models/
    embeddings.py; a vision tower's patches, models/vision.py)."""

    def __init__(self, cfg: EncoderConfig, embeddings: nn.Module | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        # Typed as the token embeddings (what every text model's code reaches into); a vision
        # tower's patches take their place.
        self.embeddings = Embeddings(cfg) if embeddings is None else cast(Embeddings, embeddings)
        self.layers = nn.ModuleList(EncoderLayer(cfg, i) for i in range(cfg.n_layers))
        # MPNet: one relative-position bias, computed once and added in every layer.
        self.relative_bias = (
            RelativePositionBias(
                cfg.relative_attention_buckets, cfg.n_heads, cfg.relative_attention_max_distance
            )
            if cfg.relative_attention_buckets
            else None
        )
        # DeBERTa: one table of relative-position vectors, shared by every layer.
        self.relative = (
            RelativeEmbeddings(
                cfg.relative_span, cfg.d_model, cfg.layer_norm_eps, cfg.norm_rel_embeddings
            )
            if cfg.disentangled
            else None
        )
        self.rotary_dim = (
            rotary_dim(cfg.d_k, cfg.rotary_fraction) if cfg.positions == "rotary" else 0
        )
        # Pre-norm and sandwich stacks end with one more norm; post-norm already ends normed.
        self.final_norm = (
            make_norm(cfg.norm_kind, cfg.d_model, cfg.layer_norm_eps, cfg.norm_bias)
            if cfg.norm != "post"
            else None
        )

    def _rotary(self, n: int, local: bool, device: torch.device) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        theta = (cfg.local_rotary_theta or cfg.rotary_theta) if local else cfg.rotary_theta
        return rotary_tables(
            n,
            self.rotary_dim,
            theta,
            device,
            cfg.rotary_scaling_factor,
            cfg.rotary_trained_length,
        )  # cos, sin: (N, r)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
        head_gates: Tensor | None = None,
    ) -> EncoderOutput:
        """head_gates: (B, L, h), layer l's head i multiplied by [:, l, i] (models/attention.py)."""
        x = self.embeddings(input_ids, token_type_ids)  # (B, N, d)
        return self.stack(x, attention_mask, need_weights, head_gates)

    def stack(
        self,
        x: Tensor,
        attention_mask: Tensor,
        need_weights: bool = False,
        head_gates: Tensor | None = None,
    ) -> EncoderOutput:
        """The layers (and the final norm) over first vectors x (B, N, d)."""
        n, device = x.shape[1], x.device
        bias = None
        if self.relative_bias is not None:
            bias = self.relative_bias(n, device)  # (1, h, N, N)
        relative = None
        if self.relative is not None:
            cfg = self.cfg
            buckets = relative_positions(
                n, cfg.position_buckets, cfg.max_relative_positions, device
            )
            relative = (self.relative(), buckets)  # (2S, d), (N, N)
        layers = cast(Iterable[EncoderLayer], self.layers)  # a ModuleList yields nn.Module
        kinds = {layer.local for layer in layers}
        rotary = {k: self._rotary(n, k, device) for k in kinds} if self.rotary_dim else {}
        window = window_mask(n, self.cfg.local_window, device, x.dtype) if True in kinds else None
        attentions = []
        for i, layer in enumerate(layers):
            x, weights = layer(
                x,
                attention_mask,
                need_weights=need_weights,
                bias=bias,
                head_gates=None if head_gates is None else head_gates[:, i],
                window=window if layer.local else None,
                rotary=rotary.get(layer.local),
                relative=relative,
            )
            if need_weights:
                attentions.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return EncoderOutput(x, tuple(attentions) if need_weights else None)


class SentenceEncoder(nn.Module):
    """Encoder + pooling (+ Dense modules) (+ optional L2 normalisation): one vector per text."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.pool = Pooling(cfg.pooling, cfg.dense_layers)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        normalize: bool = False,
        need_weights: bool = False,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        out = self.encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            need_weights=need_weights,
            head_gates=head_gates,
        )
        pooled = self.pool(out.hidden, attention_mask)  # (B, d_out)
        if normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return pooled, out.attentions


def config_of(model: nn.Module) -> EncoderConfig:
    """The EncoderConfig a model carries as `cfg`: every model here does (SentenceEncoder,
    SequenceClassifier, LastTokenHead, MultiOutputEncoder, Encoder itself)."""
    return cast(EncoderConfig, model.cfg)
