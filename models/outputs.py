"""What an encoder answers besides one pooled vector, from the same last hidden states h_t:

    bge-m3 lexical weights:  w_t = ReLU(W_s h_t + b_s)                         (B, N)
    SPLADE:                  s_v = max_t log(1 + ReLU(m_t · MLM(h_t)_v))       (B, V)
                             MLM(h) = W_E · LN(GELU(W_d h + b_d)) + b_V         (the masked-LM head)
    token vectors (ColBERT): e_t = (W_c h_t + b_c) / ‖W_c h_t + b_c‖            (B, N, d')

All three are per-token or masked by the input's own mask, so the graph stays padding-agnostic:
which tokens count (bge-m3 drops the first token and its special ids, PyLate drops a document's
punctuation and keeps a query's expansion tokens) is the service's, from the manifest. Pooling
bge-m3's per-token weights into one weight per vocabulary id (the max) is the service's too:
it is a gather over at most N ids, not a (B, V) tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import EncoderConfig
from models.encoder import Encoder
from models.pooling import Pooling

# The serving graph's output names (the manifest repeats them for the service).
DENSE = "sentence_embedding"
TOKENS = "token_embeddings"
TOKEN_WEIGHTS = "sparse_weights"  # (B, N): bge-m3's lexical weight of each token
VOCABULARY = "sparse_embedding"  # (B, V): SPLADE's pooled vocabulary vector
TOKEN_VECTORS = "colbert_vectors"  # (B, N, d'): one normalised vector per token

SparseKind = Literal["token_weights", "vocabulary"]


@dataclass(frozen=True)
class ColbertInputs:
    """PyLate's query/document handling (config_sentence_transformers.json), as strings; export
    turns them into ids with the model's tokenizer."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutputSpec:
    """Which outputs a model has, and the shapes of their heads."""

    dense: bool = True
    sparse: SparseKind | None = None
    splade_pooling: Literal["max", "sum"] = "max"
    splade_activation: Literal["relu", "log1p_relu"] = "relu"  # log1p_relu: log1p twice
    vectors_dim: int = 0  # token vectors' width d'; 0: none
    vectors_bias: bool = True
    skip_first: bool = False  # bge-m3: the first token (CLS) has no token vector
    colbert: ColbertInputs | None = None  # PyLate's markers, lengths, expansion, skiplist

    def __post_init__(self) -> None:
        if not (self.dense or self.sparse or self.vectors_dim):
            raise ValueError("a model needs at least one output")

    @property
    def names(self) -> list[str]:
        """Service-level output names, dense first."""
        out = ["dense"] if self.dense else []
        if self.sparse:
            out.append("sparse")
        if self.vectors_dim:
            out.append("multi_vector")
        return out

    @property
    def graph_outputs(self) -> list[str]:
        """The serving graph's outputs: the primary one first, then the token vectors' hidden
        states (TEI's embed_all, for a dense model), then the rest."""
        primary = DENSE if self.dense else VOCABULARY if self.sparse == "vocabulary" else TOKEN_VECTORS
        out = [primary]
        if self.dense:
            out.append(TOKENS)
        if self.sparse == "token_weights":
            out.append(TOKEN_WEIGHTS)
        if self.sparse == "vocabulary" and primary != VOCABULARY:
            out.append(VOCABULARY)
        if self.vectors_dim and primary != TOKEN_VECTORS:
            out.append(TOKEN_VECTORS)
        return out


class TokenWeights(nn.Module):
    """bge-m3's sparse_linear: (B, N, d) -> (B, N), each token's lexical weight, ≥ 0."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, 1)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.relu(self.linear(hidden)).squeeze(-1)  # (B, N)


class TokenVectors(nn.Module):
    """colbert_linear (bge-m3) or PyLate's Dense: (B, N, d) -> (B, N, d'), unit length each."""

    def __init__(self, d_model: int, dim: int, bias: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, dim, bias=bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return F.normalize(self.linear(hidden), p=2, dim=-1)  # (B, N, d')


class MaskedLMHead(nn.Module):
    """The masked-LM head of BERT, RoBERTa and DistilBERT alike: (B, N, d) -> (B, N, V).

    logits = W_E · LN(GELU(W_d h + b_d)) + b_V, W_E usually tied to the token embeddings."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.d_model, cfg.vocab_size)

    def transform(self, hidden: Tensor) -> Tensor:
        out: Tensor = self.norm(F.gelu(self.dense(hidden)))  # (B, N, d)
        return out

    def forward(self, hidden: Tensor) -> Tensor:
        logits: Tensor = self.decoder(self.transform(hidden))  # (B, N, V)
        return logits


# A padding token's logits, pushed below any real token's (max pooling): exp-free, so any
# value far past the logits' range does; the attention mask's -10000 is reused.
PADDING_LOGIT = 10000.0


class Splade(nn.Module):
    """sentence-transformers' SpladePooling over the MLM logits: (B, N, d) -> (B, V).

    sum:  s = Σ_t log1p(relu(m_t · logits_t)), as SpladePooling writes it.
    max:  s = log1p(relu(max_{t real} (W_E x_t) + b_V)), the same numbers: log1p and relu are
          monotone (non-decreasing), so they commute with the max, and padding's 0 in
          SpladePooling never exceeds relu's floor. The mask enters the decoder's GEMM as one
          more input column (0 for a real token, -10⁴ for padding, times a column of ones), so
          the only (B, N, V) work is the GEMM and the max: no elementwise pass over the logits
          (bias, mask) at V = 30,522 wide, ~15 % of a BERT-base SPLADE batch measured."""

    def __init__(self, pooling: str, activation: str) -> None:
        super().__init__()
        self.pooling = pooling
        self.twice = activation == "log1p_relu"

    def _activate(self, x: Tensor) -> Tensor:
        x = torch.log1p(torch.relu(x))
        return torch.log1p(x) if self.twice else x

    def forward(self, head: MaskedLMHead, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        m = attention_mask[:, :, None].to(hidden.dtype)  # (B, N, 1)
        if self.pooling == "sum":
            return self._activate(head(hidden) * m).sum(dim=1)  # (B, V)
        x = torch.cat([head.transform(hidden), (m - 1) * PADDING_LOGIT], dim=-1)  # (B, N, d+1)
        w = head.decoder.weight  # (V, d)
        w = torch.cat([w, torch.ones_like(w[:, :1])], dim=1)  # (V, d+1)
        top = (x @ w.T).amax(dim=1)  # (B, V): each entry's largest over the real tokens
        return self._activate(top + head.decoder.bias)


class MultiOutputEncoder(nn.Module):
    """The encoder with any of: the pooled (dense) vector, bge-m3's lexical weights, SPLADE's
    vocabulary vector, token vectors. One forward pass computes every output (`outputs`);
    `forward` answers the primary one, as the other encoders do (verify, the attention graph)."""

    def __init__(self, cfg: EncoderConfig, spec: OutputSpec) -> None:
        super().__init__()
        self.cfg = cfg
        self.spec = spec
        self.encoder = Encoder(cfg)
        self.pool = Pooling(cfg.pooling, cfg.dense_layers) if spec.dense else None
        self.token_weights = TokenWeights(cfg.d_model) if spec.sparse == "token_weights" else None
        self.mlm = MaskedLMHead(cfg) if spec.sparse == "vocabulary" else None
        self.splade = (
            Splade(spec.splade_pooling, spec.splade_activation) if self.mlm is not None else None
        )
        self.token_vectors = (
            TokenVectors(cfg.d_model, spec.vectors_dim, spec.vectors_bias)
            if spec.vectors_dim
            else None
        )

    def heads(self, hidden: Tensor, attention_mask: Tensor) -> dict[str, Tensor]:
        """Every output from the last hidden states (B, N, d), named as the graph's."""
        out: dict[str, Tensor] = {}
        if self.pool is not None:
            out[DENSE] = self.pool(hidden, attention_mask)  # (B, d_out)
            out[TOKENS] = hidden  # (B, N, d)
        if self.token_weights is not None:
            out[TOKEN_WEIGHTS] = self.token_weights(hidden)  # (B, N)
        if self.mlm is not None and self.splade is not None:
            out[VOCABULARY] = self.splade(self.mlm, hidden, attention_mask)  # (B, V)
        if self.token_vectors is not None:
            out[TOKEN_VECTORS] = self.token_vectors(hidden)  # (B, N, d')
        return {name: out[name] for name in self.spec.graph_outputs}

    def outputs(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> dict[str, Tensor]:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).hidden  # (B, N, d)
        return self.heads(hidden, attention_mask)

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
        primary = self.heads(out.hidden, attention_mask)[self.spec.graph_outputs[0]]
        if normalize and self.spec.dense:
            primary = F.normalize(primary, p=2, dim=-1)
        return primary, out.attentions
