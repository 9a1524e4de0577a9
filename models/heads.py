"""Sequence-classification heads, each as its checkpoint family has it, on the one encoder.

    BERT:        logits = W_c · tanh(W_p · h_[CLS] + b_p) + b_c      (pooler, then classifier)
    RoBERTa:     logits = W_o · tanh(W_d · h_<s> + b_d) + b_o        (classifier.dense, out_proj)
    DistilBERT:  logits = W_c · ReLU(W_p · h_[CLS] + b_p) + b_c      (pre_classifier, classifier)
    DeBERTa-v2:  logits = W_c · GELU(W_p · h_[CLS] + b_p) + b_c      (ContextPooler, classifier)
    ModernBERT:  logits = W_c · LN(GELU(W_h · pool(h))) + b_c        (head, classifier), where
                 pool is the first token or the mean (`classifier_pooling`)

The text's vector is pooled as the config's `pooling` says (first token, unless ModernBERT's
checkpoint asks for the mean). Cross-encoders (rerankers) are these with one label: the score
is sigmoid(logit).
"""

from __future__ import annotations

from torch import Tensor, nn

from models.config import EncoderConfig, HeadKind
from models.encoder import Encoder
from models.pooling import POOLERS

ACTIVATIONS = {
    "pooler_tanh": nn.Tanh,
    "dense_tanh": nn.Tanh,
    "dense_relu": nn.ReLU,
    "dense_gelu": nn.GELU,
    "dense_gelu_norm": nn.GELU,
}


class ClassificationHead(nn.Module):
    """Pooled vector -> dense -> activation (-> LayerNorm) -> out: (B, d) -> (B, num_labels)."""

    def __init__(self, cfg: EncoderConfig, num_labels: int, kind: HeadKind) -> None:
        super().__init__()
        if kind not in ACTIVATIONS:
            raise ValueError(f"unknown classification head {kind!r}")
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.head_dense_bias)
        self.activation = ACTIVATIONS[kind]()
        self.norm = (
            nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)
            if kind == "dense_gelu_norm"
            else None
        )
        self.out = nn.Linear(cfg.d_model, num_labels)
        self.kind = kind

    def forward(self, pooled: Tensor) -> Tensor:
        x = self.activation(self.dense(pooled))  # (B, d)
        if self.norm is not None:
            x = self.norm(x)
        logits: Tensor = self.out(x)  # (B, num_labels)
        return logits


class SequenceClassifier(nn.Module):
    """Encoder + classification head: a text (or a pair) -> one logit per label."""

    def __init__(self, cfg: EncoderConfig, num_labels: int, head: HeadKind) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.cfg = cfg
        self.num_labels = num_labels
        self.encoder = Encoder(cfg)
        self.pool = POOLERS[cfg.pooling]
        self.head = ClassificationHead(cfg, num_labels, head)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
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
        pooled = self.pool(out.hidden, attention_mask)  # (B, d)
        return self.head(pooled), out.attentions  # (B, num_labels)
