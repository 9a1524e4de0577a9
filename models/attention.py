"""Multi-head scaled dot-product attention, as in "Attention Is All You Need", section 3.2.

    head_i = softmax(Q W_Q^i (K W_K^i)ᵀ / √d_k + M + B_i) V W_V^i
    MHA(Q, K, V) = concat(head_1 … head_h) W_O

B is an optional additive score bias per head (MPNet's relative positions); ONNX Runtime's
fused Attention takes it as its `attention_bias` input.

What the newer encoders add, each a switch of this one module:
- grouped-query attention (Ainslie et al. 2023): n_kv_heads < n_heads key/value heads, each
  shared by a group of n_heads / n_kv_heads query heads (Gemma 3);
- a head size and a score scale of their own (Gemma's head_dim and query_pre_attn_scalar,
  DeBERTa's √(3 d_k)): scores are divided by √scale_dim, d_k unless given;
- per-head RMSNorm of q and k before rotary (Gemma 3), rotary positions (models/rotary.py),
  a local window (models/windows.py), DeBERTa's disentangled terms (models/disentangled.py),
  and tanh soft-capping of the scores (Gemma 2 style: cap · tanh(s / cap)).

Head gates (Michel, Levy & Neubig 2019): head_i's output is multiplied by a gate ξ_i before
the heads are merged, MHA = concat(ξ_1 head_1 … ξ_h head_h) W_O. ξ_i = 0 removes head i, as
zeroing its d_k columns of W_O does; ∂L/∂ξ_i is the head's importance (export/heads.py).

Masks are additive: 0 where a key may be attended, MASK_VALUE where it may not. A finite
MASK_VALUE (not -inf) keeps a row whose keys are all masked finite: it becomes uniform
instead of NaN. The explicit path is also the graph shape that ONNX Runtime's BERT optimizer
fuses into one Attention node.

Fused kernels: a module may be handed `kernels` (export does, for the serving graph of the
families ONNX Runtime's pattern matcher cannot fuse: export/fused.py). Then, when no weights are
asked for, rotary and softmax(scores + bias)·V are theirs: the padding mask goes in raw, and
every other additive term (window, causal, DeBERTa's terms, MPNet's bias) as one score bias in
the scores' own scale. The explicit path stays the reference, and the source of attention maps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.rotary import apply_rotary

# exp(-10000) underflows to exactly 0 in float32 and float16 alike; ONNX Runtime's fused
# Attention uses the same value (its mask_filter_value default).
MASK_VALUE = -10000.0


def padding_mask(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, N_k) with 1 = attend, 0 = padding  ->  additive (B, 1, 1, N_k)."""
    keep = keep[:, None, None, :].to(dtype)  # (B, 1, 1, N_k)
    return (1.0 - keep) * MASK_VALUE


def causal_mask(n_q: int, n_k: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Additive (1, 1, N_q, N_k): query i sees keys j <= i (aligned at the end when N_k > N_q)."""
    offset = n_k - n_q
    allowed = torch.ones(n_q, n_k, device=device, dtype=torch.bool).tril(diagonal=offset)
    return (~allowed).to(dtype)[None, None] * MASK_VALUE  # (1, 1, N_q, N_k)


class FusedKernels(Protocol):
    """Another implementation of rotary and of the attention core, for graphs without weights."""

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
        """apply_rotary's result: x (B, heads, N, d_k), cos/sin (N, r)."""
        ...

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        bias: Tensor | None,
        scale: float,
    ) -> Tensor:
        """softmax(q·kᵀ·scale + padding + bias)·v with heads merged: q (B, h, N_q, d_k), k and
        v (B, h_kv, N_k, d_k), key_padding_mask (B, N_k) 1 = real, bias (1|B, 1|h, N_q, N_k)
        -> (B, N_q, h·d_k)."""
        ...


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, h_kv, N, d_k) -> (B, h_kv·groups, N, d_k): query head i reads kv head i // groups."""
    if groups == 1:
        return x
    x = x[:, :, None].expand(-1, -1, groups, -1, -1)  # (B, h_kv, groups, N, d_k)
    return x.flatten(1, 2)  # (B, h, N, d_k)


def gated(context: Tensor, head_gates: Tensor | None) -> Tensor:
    """Each head's output times its gate: context (B, h, N, d_k), head_gates (B, h)."""
    if head_gates is None:
        return context
    return context * head_gates[:, :, None, None].to(context.dtype)  # (B, h, N, d_k)


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        impl: str = "explicit",
        *,
        n_kv_heads: int = 0,
        head_dim: int = 0,
        scale_dim: int = 0,
        softcap: float = 0.0,
        qk_norm: Callable[[int], nn.Module] | None = None,
        relative: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if not head_dim and d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if impl not in ("explicit", "sdpa"):
            raise ValueError(f"impl must be 'explicit' or 'sdpa', got {impl!r}")
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        if softcap and impl == "sdpa":
            raise ValueError("the sdpa path cannot soft-cap scores: use the explicit path")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.groups = n_heads // n_kv_heads
        self.d_k = head_dim or d_model // n_heads
        self.scale_dim = scale_dim or self.d_k  # scores are divided by √scale_dim
        self.softcap = softcap
        self.impl = impl
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k, bias=bias)  # W_Q for all heads
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_k, bias=bias)  # W_K
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_k, bias=bias)  # W_V
        self.out_proj = nn.Linear(n_heads * self.d_k, d_model, bias=bias)  # W_O
        self.q_norm = qk_norm(self.d_k) if qk_norm else None
        self.k_norm = qk_norm(self.d_k) if qk_norm else None
        self.relative = relative  # DisentangledScores, or None
        self.kernels: FusedKernels | None = None  # set by export for its serving graph only

    def _split_heads(self, x: Tensor, heads: int) -> Tensor:
        b, n, _ = x.shape
        # (B, N, h·d_k) -> (B, N, h, d_k) -> (B, h, N, d_k)
        return x.view(b, n, heads, self.d_k).permute(0, 2, 1, 3)

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, _, n, _ = x.shape
        # (B, h, N, d_k) -> (B, N, h, d_k) -> (B, N, h·d_k)
        return x.permute(0, 2, 1, 3).reshape(b, n, self.n_heads * self.d_k)

    def _attend_fused(
        self,
        fused: FusedKernels,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        causal: bool,
        window: Tensor | None,
        extra: Tensor | None,
        bias: Tensor | None,
    ) -> Tensor:
        """The kernels' attention: the padding mask raw, every other additive term in one score
        bias, in the scores' own scale (DeBERTa's terms are scaled with q·kᵀ)."""
        if self.softcap:
            raise ValueError("attention soft-capping has no fused kernel: use the explicit path")
        scale = 1.0 / math.sqrt(self.scale_dim)
        terms = [
            window,  # (1, 1, N_q, N_k)
            causal_mask(q.shape[2], k.shape[2], q.device, q.dtype) if causal else None,
            None if extra is None else extra * scale,  # (B, h, N_q, N_k)
            bias,  # (1, h, N_q, N_k)
        ]
        present = [t for t in terms if t is not None]
        score_bias = sum(present[1:], present[0]) if present else None
        return fused.attend(q, k, v, key_padding_mask, score_bias, scale)  # (B, N_q, h·d_k)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        bias: Tensor | None = None,
        *,
        window: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        relative: tuple[Tensor, Tensor] | None = None,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """query (B, N_q, d); key/value (B, N_k, d), default: self-attention on query.

        key_padding_mask: (B, N_k), 1 = real token, 0 = padding.
        bias: additive scores (1 or B, h, N_q, N_k), added after the mask.
        window: additive band (1, 1, N_q, N_k) of a local layer, added to the padding mask.
        rotary: cos, sin (N, r) for the positions 0 … N-1 of queries and keys alike.
        relative: DeBERTa's shared relative embeddings (2S, d) and bucketed i - j (N_q, N_k).
        head_gates: (B, h), each head's output multiplied by its gate before the merge.
        Returns the output (B, N_q, d) and, with need_weights, the probabilities (B, h, N_q, N_k).
        """
        key = query if key is None else key
        value = key if value is None else value
        fused = None if need_weights else self.kernels
        q = self._split_heads(self.q_proj(query), self.n_heads)  # (B, h, N_q, d_k)
        k = self._split_heads(self.k_proj(key), self.n_kv_heads)  # (B, h_kv, N_k, d_k)
        v = self._split_heads(self.v_proj(value), self.n_kv_heads)  # (B, h_kv, N_k, d_k)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither
            q, k = self.q_norm(q), self.k_norm(k)  # RMS over each head's d_k channels
        if rotary is not None and fused is not None:
            q, k = fused.rotate(q, *rotary, self.n_heads), fused.rotate(k, *rotary, self.n_kv_heads)
        elif rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)

        extra = None  # disentangled terms, unscaled: (B, h, N_q, N_k)
        if self.relative is not None and relative is not None:
            extra = self.relative(q, k, *relative, self.q_proj, self.k_proj)
        if fused is not None:
            if head_gates is not None:
                raise ValueError("head gates need the explicit path: fused kernels merge heads")
            context = self._attend_fused(
                fused, q, k, v, key_padding_mask, causal, window, extra, bias
            )
            return self.out_proj(context), None  # (B, N_q, d)

        mask = None
        if key_padding_mask is not None:
            mask = padding_mask(key_padding_mask, q.dtype)  # (B, 1, 1, N_k)
        if causal:
            c = causal_mask(q.shape[2], k.shape[2], q.device, q.dtype)  # (1, 1, N_q, N_k)
            mask = c if mask is None else mask + c
        if window is not None:
            mask = window if mask is None else mask + window  # (B, 1, N_q, N_k)

        p_drop = self.dropout if self.training else 0.0
        if self.impl == "sdpa" and not need_weights:
            if extra is not None:  # sdpa scales q·kᵀ only: hand it the terms scaled
                extra = extra / math.sqrt(self.scale_dim)
                mask = extra if mask is None else mask + extra
            if bias is not None:
                mask = bias if mask is None else mask + bias  # (B, h, N_q, N_k)
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=p_drop,
                scale=1.0 / math.sqrt(self.scale_dim),
                enable_gqa=self.groups > 1,
            )  # (B, h, N_q, d_k)
            return self.out_proj(self._merge_heads(gated(context, head_gates))), None

        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # (B, h, N_k, d_k)
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, h, N_q, N_k)
        if extra is not None:
            scores = scores + extra
        scores = scores / math.sqrt(self.scale_dim)
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is not None:
            scores = scores + mask
        # The bias is its own Add after the mask's: export detaches it, lets ONNX Runtime fuse
        # the BERT pattern, and hands it to the fused node as `attention_bias`.
        if bias is not None:
            scores = scores + bias  # (B, h, N_q, N_k)
        weights = torch.softmax(scores, dim=-1)  # (B, h, N_q, N_k), rows sum to 1
        context = torch.matmul(F.dropout(weights, p_drop, self.training), v)  # (B, h, N_q, d_k)
        out = self.out_proj(self._merge_heads(gated(context, head_gates)))  # (B, N_q, d)
        return out, (weights if need_weights else None)
