"""Removing heads and FFN neurons from a trained encoder (Michel, Levy & Neubig 2019; TextPruner):
what is removed is cut out of the weights, not masked, so the graph computes less.

Head i of a layer is its d_k rows of W_Q, W_K and W_V (and their biases) and its d_k columns of
W_O; FFN neuron j is row j of W_1 (and b_1) and column j of W_2 (a gated FFN: of W_gate, W_up
and W_down). A layer without them computes exactly what it computed with their gates at 0 (a
test checks it). The config records what stays (EncoderConfig.kept_heads: each layer's original
head indices; ffn_sizes), so that a pruned checkpoint loads back into the same shapes and a head
keeps its index: head 7 of layer 3 stays head 7, its map and its gate in the same slot.

BERT-generation families first: grouped-query attention, per-head q/k norms, rotary positions,
MPNet's per-head bias and DeBERTa's terms are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn

from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.encoder import Encoder, EncoderLayer, config_of
from models.ffn import FeedForward, GatedFeedForward


def why_not_prunable(cfg: EncoderConfig) -> str | None:
    """Why this architecture's heads cannot be pruned here yet (None: they can)."""
    reasons = {
        "grouped-query attention": cfg.n_kv_heads not in (0, cfg.n_heads),
        "per-head q/k norms": cfg.qk_norm,
        "rotary positions": cfg.positions == "rotary",
        "MPNet's per-head relative bias": bool(cfg.relative_attention_buckets),
        "DeBERTa's disentangled attention": bool(cfg.disentangled),
        "a decoder": cfg.causal,
    }
    found = [name for name, present in reasons.items() if present]
    if not found:
        return None
    return (
        f"{cfg.architecture}: pruning supports BERT-generation encoders so far, not "
        f"{' or '.join(found)}"
    )


def _rows(linear: nn.Linear, keep: torch.Tensor) -> nn.Linear:
    out = nn.Linear(linear.in_features, len(keep), bias=linear.bias is not None)
    with torch.no_grad():
        out.weight.copy_(linear.weight[keep])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[keep])
    return out


def _columns(linear: nn.Linear, keep: torch.Tensor) -> nn.Linear:
    out = nn.Linear(len(keep), linear.out_features, bias=linear.bias is not None)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, keep])
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out


def layers_of(model: nn.Module) -> list[EncoderLayer]:
    """The model's encoder layers (every model here has its Encoder as `encoder`)."""
    encoder = cast(Encoder, model.encoder)
    return [cast(EncoderLayer, layer) for layer in encoder.layers]


def _set_config(model: nn.Module, cfg: EncoderConfig) -> None:
    """The model's config and its encoder's: the one object both carry."""
    cast(Any, model).cfg = cfg
    cast(Any, model.encoder).cfg = cfg


def remove_heads(model: nn.Module, removed: Mapping[int, Sequence[int]]) -> None:
    """Cut out heads, by layer and original head index."""
    cfg = config_of(model)
    if (why := why_not_prunable(cfg)) is not None:
        raise ValueError(why)
    layers = layers_of(model)
    for index, heads in removed.items():
        layer = layers[index]
        attn: MultiHeadAttention = layer.attn
        gone = set(heads)
        unknown = gone - set(layer.kept)
        if unknown:
            raise ValueError(f"layer {index} has no head {sorted(unknown)} (it has {layer.kept})")
        stay = [p for p, h in enumerate(layer.kept) if h not in gone]
        if not stay:
            raise ValueError(f"removing {sorted(gone)} would leave layer {index} without heads")
        d_k = attn.d_k
        rows = torch.tensor([p * d_k + c for p in stay for c in range(d_k)])
        attn.q_proj, attn.k_proj, attn.v_proj = (
            _rows(attn.q_proj, rows),
            _rows(attn.k_proj, rows),
            _rows(attn.v_proj, rows),
        )
        attn.out_proj = _columns(attn.out_proj, rows)
        attn.n_heads = attn.n_kv_heads = len(stay)
        layer.kept = [layer.kept[p] for p in stay]
    _set_config(model, replace(cfg, kept_heads=tuple(tuple(layer.kept) for layer in layers)))


def remove_neurons(model: nn.Module, removed: Mapping[int, Iterable[int]]) -> None:
    """Cut out FFN neurons, by layer and current neuron index."""
    cfg = config_of(model)
    layers = layers_of(model)
    for index, neurons in removed.items():
        ffn = layers[index].ffn
        gone = set(neurons)
        width = ffn_width(ffn)
        keep = torch.tensor([j for j in range(width) if j not in gone])
        if not len(keep):
            raise ValueError(f"removing {len(gone)} neurons would empty layer {index}'s FFN")
        if isinstance(ffn, FeedForward):
            ffn.fc1, ffn.fc2 = _rows(ffn.fc1, keep), _columns(ffn.fc2, keep)
        elif isinstance(ffn, GatedFeedForward):
            ffn.gate, ffn.up = _rows(ffn.gate, keep), _rows(ffn.up, keep)
            ffn.down = _columns(ffn.down, keep)
        else:
            raise ValueError(f"cannot prune an FFN of type {type(ffn).__name__}")
    sizes = tuple(ffn_width(layer.ffn) for layer in layers)
    _set_config(model, replace(cfg, ffn_sizes=sizes))


def ffn_width(ffn: nn.Module) -> int:
    """Neurons of an FFN (d_ff)."""
    if isinstance(ffn, FeedForward):
        return ffn.fc1.out_features
    if isinstance(ffn, GatedFeedForward):
        return ffn.gate.out_features
    raise ValueError(f"cannot prune an FFN of type {type(ffn).__name__}")


def ffn_output(ffn: nn.Module) -> nn.Linear:
    """The FFN's last projection (W_2, W_down): its column j is neuron j's way out."""
    if isinstance(ffn, FeedForward):
        return ffn.fc2
    if isinstance(ffn, GatedFeedForward):
        return ffn.down
    raise ValueError(f"cannot prune an FFN of type {type(ffn).__name__}")
