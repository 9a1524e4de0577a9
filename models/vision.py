"""A vision transformer (Dosovitskiy et al. 2020): an image cut into patches, each patch a token,
and then the same encoder stack as text (models/encoder.py), over patches instead of words.

    patches:  P = the image cut into (H/p)·(W/p) squares of p × p pixels, each flattened
    tokens:   x = P·W_patch (+ b)   (one strided convolution does the cut and the projection)
    CLIP:     x = LN_pre([x_class; x] + E_pos)     pre-norm layers   v = LN_post(x_0) · W_proj
    SigLIP:   x = x + E_pos                        pre-norm layers   v = MAP(LN_post(x))

SigLIP pools with multi-head attention pooling (MAP, Zhai et al. 2022): one learned probe
vector is the query of one more attention over every patch, followed by a residual MLP; its
per-head map says which patches the image's vector was read from.

Positions are learned for the checkpoint's one image size: the service always resizes to it
(service/images), so the table is never interpolated (transformers' interpolate_pos_encoding
is for other sizes, which headwise does not take).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from models.attention import MultiHeadAttention
from models.config import EncoderConfig
from models.encoder import Encoder
from models.ffn import make_ffn
from models.norms import make_norm

VisionPooling = Literal["cls", "map"]


@dataclass(frozen=True)
class VisionConfig:
    """A vision tower: its encoder stack (pre-norm; the final norm is the tower's LN_post), and
    what the patches and the pooling add."""

    stack: EncoderConfig
    image_size: int
    patch_size: int
    channels: int = 3
    patch_bias: bool = False  # CLIP's patch projection has no bias, SigLIP's has
    class_token: bool = True  # CLIP prepends a learned class token; SigLIP has none
    pre_norm: bool = True  # CLIP's LN_pre on the embeddings
    pooling: VisionPooling = "cls"
    projection: tuple[int, int, bool] | None = None  # (in, out, bias): CLIP's visual_projection

    def __post_init__(self) -> None:
        if self.image_size <= 0 or self.patch_size <= 0 or self.image_size % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} must be a positive multiple of patch_size "
                f"{self.patch_size}"
            )
        if self.pooling == "cls" and not self.class_token:
            raise ValueError("pooling 'cls' needs a class token")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def tokens(self) -> int:
        """The sequence the encoder runs: the patches (and the class token first)."""
        return self.num_patches + int(self.class_token)

    @property
    def embedding_dim(self) -> int:
        return self.projection[1] if self.projection else self.stack.d_model


class PatchEmbeddings(nn.Module):
    """(B, C, H, W) pixels -> (B, N, d) first vectors: patches projected, class token, positions."""

    def __init__(self, v: VisionConfig) -> None:
        super().__init__()
        d = v.stack.d_model
        self.patch = nn.Conv2d(
            v.channels, d, kernel_size=v.patch_size, stride=v.patch_size, bias=v.patch_bias
        )
        self.class_token = nn.Parameter(torch.zeros(d)) if v.class_token else None
        self.positions = nn.Embedding(v.tokens, d)
        self.norm = make_norm("layer", d, v.stack.layer_norm_eps) if v.pre_norm else None

    def forward(self, pixel_values: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        x = self.patch(pixel_values)  # (B, d, H/p, W/p): one vector per patch
        x = x.flatten(2).transpose(1, 2)  # (B, P, d), patches in row-major order
        if self.class_token is not None:
            cls = self.class_token.expand(x.shape[0], 1, -1)  # (B, 1, d)
            x = torch.cat([cls, x], dim=1)  # (B, 1 + P, d)
        x = x + self.positions.weight[None]  # (B, N, d)
        if self.norm is not None:
            x = self.norm(x)  # (B, N, d)
        out: Tensor = x
        return out


class AttentionPooling(nn.Module):
    """SigLIP's MAP head: a learned probe attends over the tokens, then a residual MLP.

        y = Attn(probe, x, x);   v = y + MLP(LN(y))"""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.probe = nn.Parameter(torch.zeros(1, 1, d))
        self.attn = MultiHeadAttention(d, cfg.n_heads, bias=True)
        self.norm = make_norm("layer", d, cfg.layer_norm_eps)
        self.ffn = make_ffn(cfg.ffn_kind, d, cfg.d_ff)

    def forward(self, hidden: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """hidden (B, N, d) -> pooled (B, d) and, with need_weights, the probe's map (B, h, 1, N)."""
        probe = self.probe.expand(hidden.shape[0], -1, -1)  # (B, 1, d)
        every = torch.ones(hidden.shape[:2], dtype=torch.int64, device=hidden.device)
        y, weights = self.attn(
            probe, hidden, hidden, key_padding_mask=every, need_weights=need_weights
        )  # (B, 1, d)
        y = y + self.ffn(self.norm(y))
        return y[:, 0], weights


@dataclass
class VisionOutput:
    pooled: Tensor  # (B, d_out): the image's vector (projected)
    hidden: Tensor  # (B, N, d): the last layer's token vectors, normed
    attentions: tuple[Tensor, ...] | None  # per layer (B, h, N, N), with need_weights
    pool_weights: Tensor | None  # MAP's probe over the tokens (B, h, 1, N), with need_weights


class VisionEncoder(nn.Module):
    """Pixels -> one vector per image (and every patch's vector, and the maps)."""

    def __init__(self, v: VisionConfig) -> None:
        super().__init__()
        self.vision = v
        self.cfg = v.stack  # config_of: the stack's numbers (layers, heads) as any encoder's
        self.encoder = Encoder(v.stack, embeddings=PatchEmbeddings(v))
        self.pool = AttentionPooling(v.stack) if v.pooling == "map" else None
        i, o, b = v.projection or (0, 0, False)
        self.projection = nn.Linear(i, o, bias=b) if v.projection else None

    def run(
        self, pixel_values: Tensor, need_weights: bool = False, head_gates: Tensor | None = None
    ) -> VisionOutput:
        """pixel_values (B, C, H, W) as service/images prepares them; head_gates (B, L, h)."""
        x = self.encoder.embeddings(pixel_values)  # (B, N, d)
        every = torch.ones(x.shape[:2], dtype=torch.int64, device=x.device)  # no padding
        out = self.encoder.stack(x, every, need_weights, head_gates)
        pool_weights = None
        if self.pool is not None:
            pooled, pool_weights = self.pool(out.hidden, need_weights)
        else:
            pooled = out.hidden[:, 0]  # the class token (LN_post is the stack's final norm)
        if self.projection is not None:
            pooled = self.projection(pooled)
        return VisionOutput(pooled, out.hidden, out.attentions, pool_weights)

    def forward(
        self,
        pixel_values: Tensor,
        need_weights: bool = False,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """As every model here: the primary output, and the maps with need_weights."""
        out = self.run(pixel_values, need_weights, head_gates)
        return out.pooled, out.attentions
