"""ONNX Runtime's fused attention for the families its BERT pattern matcher cannot see.

ORT's transformer optimizer fuses one pattern, softmax(QKᵀ/√d_k + mask)·V fed by a plain
projection, into its packed `Attention` node. Rotary positions between the projection and the
scores (ModernBERT, NomicBERT, Gemma), a local window's band, grouped kv heads, per-head q/k
norms (Gemma) and DeBERTa's c2p/p2c terms each hide that pattern: the optimizer leaves every
Softmax in place (checked on tiny exports with model types bert, gpt2, gpt_neox, qwen3).

So for those families export writes ORT's contrib nodes itself, into the serving graph only
(models/attention.py hands the attention core to `OrtKernels`):

- `RotaryEmbedding` (com.microsoft) for q and for k, on (B, h, N, d_k), with cos/sin caches of
  (N, r/2) computed in the graph for every input length (NomicBERT's NTK base depends on N)
  and `rotary_embedding_dim` for partial rotary;
- `MultiHeadAttention` (com.microsoft) on q, k, v (B, N, h·d_k), the raw (B, N) padding mask
  and one additive `attention_bias`: the window's band (1, 1, N, N), DeBERTa's c2p + p2c terms
  scaled like the scores (B, h, N, N), MPNet's bias. Grouped kv heads are repeated first.

What ORT 1.32 does not offer, and why these and not others:
- `Attention` with `do_rotary`: the CPU kernel refuses it ("Rotary embedding is not supported
  in Attention CPU kernel. Please fuse the model with MHA + RotaryEmbedding"); where it runs,
  `rotary_embedding_dim` is limited to 32/64/128 and there is no base (theta) attribute, while
  these families rotate with bases of 160000, 10000, 1000 or 1000000.
- `GroupQueryAttention` (kv heads, rotary, q/k norms, `causal=0`): padding only as right-padded
  lengths (`seqlens_k`), and `local_window_size` must be -1 when `causal` is 0; a bundle takes
  left-padded batches too, so its mask would have to become a (B, 1, N, N) float bias.
- No op has a symmetric window: the band is a dense bias, so a local layer still computes all
  N × N scores. No op has DeBERTa's relative terms: they are computed outside (GatherElements).
- `MultiHeadAttention` has no soft-capping: a config with `attn_softcap` is not fused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx
from torch.onnx import symbolic_helper

from models.attention import MASK_VALUE, MultiHeadAttention, repeat_kv
from models.config import EncoderConfig
from models.encoder import config_of
from models.rotary import apply_rotary, rotary_dim

if TYPE_CHECKING:
    from torch._C import Value
    from torch.onnx._internal.torchscript_exporter.jit_utils import GraphContext

# The families whose export ORT's BERT fusion matches (one packed Attention per layer). A graph
# of theirs that does not fuse is a regression, and export fails on it.
MATCHED_BY_ORT = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Plan:
    """How export gets a family's attention fused: ORT's pattern matcher ("match"), our own
    contrib nodes ("emit"), or not at all ("none", with the reason the manifest records)."""

    kind: Literal["match", "emit", "none"]
    reason: str | None = None


def plan(cfg: EncoderConfig) -> Plan:
    if cfg.architecture in MATCHED_BY_ORT:
        return Plan("match")
    if cfg.attn_softcap:
        return Plan(
            "none",
            f"{cfg.architecture}: attention soft-capping (cap · tanh(s / cap)) has no ONNX "
            "Runtime kernel: MultiHeadAttention has no softcap, and GroupQueryAttention's takes "
            "padding only as right-padded lengths (seqlens_k); serving the unfused graph",
        )
    return Plan("emit")


def expected_nodes(cfg: EncoderConfig, attention: int | None = None) -> dict[str, int]:
    """What an emitted serving graph must hold: one MultiHeadAttention per layer (or per
    `attention` module: SigLIP's pooling head is one more), a RotaryEmbedding for q and one for
    k per layer when positions rotate, and no Softmax."""
    rotary = 2 * cfg.n_layers if cfg.positions == "rotary" else 0
    mha = cfg.n_layers if attention is None else attention
    return {"MultiHeadAttention": mha, "RotaryEmbedding": rotary, "Softmax": 0}


class _RotaryEmbedding(torch.autograd.Function):
    """x (B, h, N, d_k) rotated on its first r channels by the (N, r/2) caches."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: Tensor, cos: Tensor, sin: Tensor, heads: int, r: int
    ) -> Tensor:
        return apply_rotary(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))

    @staticmethod
    def symbolic(g: GraphContext, x: Value, cos: Value, sin: Value, heads: int, r: int) -> Value:
        start = g.op("Constant", value_t=torch.tensor([0], dtype=torch.int64))  # positions 0…N-1
        out: Value = g.op(
            f"{DOMAIN}::RotaryEmbedding",
            x,
            start,
            cos,
            sin,
            num_heads_i=heads,
            rotary_embedding_dim_i=r,
            interleaved_i=0,
        )
        out.setType(x.type())  # x's shape and dtype (the exporter cannot infer a contrib op's)
        return out


class _MultiHeadAttention(torch.autograd.Function):
    """q, k, v (B, N, h·d_k), mask (B, N_k) 1 = real, bias (1|B, 1|h, N_q, N_k) or None."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor,
        bias: Tensor | None,
        heads: int,
        scale: float,
    ) -> Tensor:
        b, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
        q = q.view(b, n_q, heads, -1).transpose(1, 2)  # (B, h, N_q, d_k)
        k = k.view(b, n_k, heads, -1).transpose(1, 2)  # (B, h, N_k, d_k)
        v = v.view(b, n_k, heads, -1).transpose(1, 2)  # (B, h, N_k, d_v)
        scores = q @ k.transpose(-1, -2) * scale  # (B, h, N_q, N_k)
        scores = scores + (1.0 - mask[:, None, None, :].to(q.dtype)) * MASK_VALUE
        if bias is not None:
            scores = scores + bias
        context = scores.softmax(-1) @ v  # (B, h, N_q, d_v)
        return context.transpose(1, 2).reshape(b, n_q, -1)  # (B, N_q, h·d_v)

    @staticmethod
    def symbolic(
        g: GraphContext,
        q: Value,
        k: Value,
        v: Value,
        mask: Value,
        bias: Value | None,
        heads: int,
        scale: float,
    ) -> Value:
        mask = g.op("Cast", mask, to_i=6)  # int32, as the kernel takes it
        # "" in the inputs (torch leaves this helper unannotated)
        absent = symbolic_helper._optional_input_placeholder_tensor(g)  # type: ignore[no-untyped-call]
        inputs = [q, k, v, absent, mask]  # no projection bias: q, k, v come projected
        if bias is not None and not symbolic_helper._is_none(bias):
            inputs.append(bias)
        out: Value = g.op(
            f"{DOMAIN}::MultiHeadAttention",
            *inputs,
            num_heads_i=heads,
            scale_f=scale,
            mask_filter_value_f=MASK_VALUE,
        )
        out.setType(q.type())  # (B, N_q, h·d_k), as q: v's head size is q's here
        return out


# Function.apply is unannotated in torch: it takes and returns what the forwards above do.
_rotary_embedding = cast(
    Callable[[Tensor, Tensor, Tensor, int, int], Tensor], _RotaryEmbedding.apply
)
_multi_head_attention = cast(
    Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, int, float], Tensor],
    _MultiHeadAttention.apply,
)


class OrtKernels:
    """models.attention.FusedKernels as ONNX Runtime's contrib nodes (export/fused.py's
    docstring); in PyTorch the same math, so the traced graph has the shapes it will run with."""

    def __init__(self, n_heads: int, n_kv_heads: int, rotary: int) -> None:
        self.n_heads = n_heads
        self.groups = n_heads // n_kv_heads
        self.rotary = rotary  # rotated channels per head; 0 without rotary

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
        half = self.rotary // 2  # the tables repeat their halves: the caches are one half
        return _rotary_embedding(x, cos[:, :half], sin[:, :half], heads, self.rotary)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        bias: Tensor | None,
        scale: float,
    ) -> Tensor:
        if key_padding_mask is None:
            raise ValueError("ONNX Runtime's MultiHeadAttention is emitted with a padding mask")
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # (B, h, N_k, d_k)

        def merge(x: Tensor) -> Tensor:
            return x.transpose(1, 2).flatten(2)  # (B, h, N, d_k) -> (B, N, h·d_k)

        return _multi_head_attention(
            merge(q), merge(k), merge(v), key_padding_mask, bias, self.n_heads, scale
        )


@contextmanager
def ort_kernels(model: nn.Module) -> Iterator[int]:
    """Every attention module of `model` runs on OrtKernels inside the block (the serving
    graph's export); yields how many modules were switched."""
    cfg = config_of(model)
    if cfg.attn_softcap:
        raise ValueError(plan(cfg).reason)
    r = rotary_dim(cfg.d_k, cfg.rotary_fraction) if cfg.positions == "rotary" else 0
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in modules:
        m.kernels = OrtKernels(m.n_heads, m.n_kv_heads, r)
    try:
        yield len(modules)
    finally:
        for m in modules:
            m.kernels = None
