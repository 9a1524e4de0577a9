"""NomicBERT as the remote code nomic-ai/nomic-embed-text-v1.5 publishes it (modeling_hf_nomic_bert
.py, GPT2Config keys): checkpoints in its layout, and its forward pass written out from its
math, as the reference for what transformers' NomicBertModel lacks (partial rotary, biases,
rotary_scaling_factor, the 256-rounded gated MLP).

The reference follows the remote code step by step: word + token-type embeddings, emb_ln;
per layer Wqkv split as "(three h d)", rotary on the first rotary_emb_fraction · d_k channels
of q and k (non-interleaved halves), scores / √d_k + (1 - mask) · finfo.min, softmax,
out_proj, norm1(x + attn); y = fc2(fc11(x) · silu(fc12(x))), norm2(x + y). Dynamic NTK: base ·
(factor · N / max_trained_positions - (factor - 1)) ^ (r / (r - 2)) when N exceeds
max_trained_positions (computed afresh, i.e. the remote code's first call at that length).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from tests.models.checkpoints import write_tokenizer


def remote_config(**changes) -> dict:
    """nomic-embed-text-v1.5's config.json, shrunk."""
    cfg = {
        "model_type": "nomic_bert",
        "architectures": ["NomicBertModel"],
        "activation_function": "swiglu",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 3,
        "n_inner": 256,
        "n_positions": 128,
        "vocab_size": 100,
        "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "max_trained_positions": 2048,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "causal": False,
        "parallel_block": False,
        "use_rms_norm": False,
        "pad_vocab_size_multiple": 64,
    }
    return {**cfg, **changes}


def hidden_features(cfg: dict) -> int:
    """The remote gated MLP's width: n_inner rounded up to a multiple of 256."""
    return -(-(cfg["n_inner"] or int(8 * cfg["n_embd"] / 3)) // 256) * 256


def padded_vocab(cfg: dict) -> int:
    """The remote model pads its embedding table to pad_vocab_size_multiple rows."""
    multiple = cfg.get("pad_vocab_size_multiple", 1)
    return -(-cfg["vocab_size"] // multiple) * multiple


def random_state(cfg: dict, seed: int = 0) -> dict[str, Tensor]:
    """Weights in the remote layout, ~N(0, 0.1) (LayerNorm scales ~1)."""
    g = torch.Generator().manual_seed(seed)
    d, f = cfg["n_embd"], hidden_features(cfg)

    def rnd(*shape, around=0.0):
        return around + 0.1 * torch.randn(*shape, generator=g)

    state = {
        "embeddings.word_embeddings.weight": rnd(padded_vocab(cfg), d),
        "embeddings.token_type_embeddings.weight": rnd(cfg["type_vocab_size"], d),
        "emb_ln.weight": rnd(d, around=1.0),
        "emb_ln.bias": rnd(d),
    }
    shapes = {"attn.Wqkv": (3 * d, d), "attn.out_proj": (d, d)}
    shapes |= {"mlp.fc11": (f, d), "mlp.fc12": (f, d), "mlp.fc2": (d, f)}
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        for name, shape in shapes.items():
            state[p + name + ".weight"] = rnd(*shape)
            bias = cfg["qkv_proj_bias"] if name.startswith("attn") else cfg["mlp_fc1_bias"]
            if bias:
                state[p + name + ".bias"] = rnd(shape[0])
        for norm in ("norm1", "norm2"):
            state[p + norm + ".weight"] = rnd(d, around=1.0)
            state[p + norm + ".bias"] = rnd(d)
    return state


def from_transformers(hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' NomicBertModel tensors renamed into the remote layout (the inverse of
    transformers' own conversion_mapping for nomic_bert)."""
    out = {}
    for name, t in hf_state.items():
        name = name.replace("embeddings.LayerNorm", "emb_ln").replace("layers.", "encoder.layers.")
        for theirs, remote in (
            ("self_attn.o_proj", "attn.out_proj"),
            ("mlp.up_proj", "mlp.fc11"),
            ("mlp.gate_proj", "mlp.fc12"),
            ("mlp.down_proj", "mlp.fc2"),
            ("post_attention_layernorm", "norm1"),
            ("post_mlp_layernorm", "norm2"),
        ):
            name = name.replace(theirs, remote)
        out[name] = t
    for q in [n for n in out if ".self_attn.q_proj." in n]:
        parts = [out.pop(q.replace("q_proj", p)) for p in ("q_proj", "k_proj", "v_proj")]
        out[q.replace("self_attn.q_proj", "attn.Wqkv")] = torch.cat(parts, dim=0)
    return out


def save_remote(folder: Path, cfg: dict, state: dict[str, Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    write_tokenizer(folder, 100)
    return folder


def _linear(x: Tensor, state: dict[str, Tensor], name: str) -> Tensor:
    return F.linear(x, state[name + ".weight"], state.get(name + ".bias"))


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    r = cos.shape[-1] * 2
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # "... d -> ... (2 d)"
    x1, x2 = x[..., :r].chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x[..., :r] * cos + rotated * sin, x[..., r:]), dim=-1)


def reference(cfg: dict, state: dict[str, Tensor], ids: Tensor, mask: Tensor):
    """The remote code's forward: last hidden state (B, N, d) and probabilities per layer."""
    d, h = cfg["n_embd"], cfg["n_head"]
    d_k, n, eps = d // h, ids.shape[1], cfg["layer_norm_epsilon"]
    x = state["embeddings.word_embeddings.weight"][ids]
    x = x + state["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)]
    x = F.layer_norm(x, (d,), state["emb_ln.weight"], state["emb_ln.bias"], eps)
    r = d_k * cfg["rotary_emb_fraction"]
    base, factor = float(cfg["rotary_emb_base"]), cfg.get("rotary_scaling_factor")
    if factor and n > cfg["max_trained_positions"]:
        base = base * ((factor * n / cfg["max_trained_positions"]) - (factor - 1)) ** (r / (r - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)  # (N, r/2)
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]  # (N, 1, r/2): over heads
    extended = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    probs = []
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        qkv = _linear(x, state, p + "attn.Wqkv").view(*x.shape[:2], 3, h, d_k)
        q, k, v = (qkv[:, :, j] for j in range(3))  # (B, N, h, d_k)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # (B, h, N, d_k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_k) + extended
        attn = torch.softmax(scores, dim=-1)
        probs.append(attn)
        out = _linear((attn @ v).permute(0, 2, 1, 3).reshape(*x.shape), state, p + "attn.out_proj")
        x = F.layer_norm(out + x, (d,), state[p + "norm1.weight"], state[p + "norm1.bias"], eps)
        y = _linear(x, state, p + "mlp.fc11") * F.silu(_linear(x, state, p + "mlp.fc12"))
        y = _linear(y, state, p + "mlp.fc2")
        x = F.layer_norm(y + x, (d,), state[p + "norm2.weight"], state[p + "norm2.bias"], eps)
    return x, tuple(probs)
