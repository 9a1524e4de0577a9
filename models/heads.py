"""Sequence-classification heads, each as its checkpoint family has it, on the one encoder.

    BERT:        logits = W_c · tanh(W_p · h_[CLS] + b_p) + b_c      (pooler, then classifier)
    RoBERTa:     logits = W_o · tanh(W_d · h_<s> + b_d) + b_o        (classifier.dense, out_proj)
    DistilBERT:  logits = W_c · ReLU(W_p · h_[CLS] + b_p) + b_c      (pre_classifier, classifier)

Cross-encoders (rerankers) are these with one label: the score is sigmoid(logit).
"""

from __future__ import annotations

from torch import Tensor, nn

from models.config import EncoderConfig, HeadKind
from models.encoder import Encoder


class ClassificationHead(nn.Module):
    """First token -> dense -> activation -> out: (B, N, d) -> (B, num_labels)."""

    def __init__(self, d_model: int, num_labels: int, kind: HeadKind) -> None:
        super().__init__()
        if kind not in ("pooler_tanh", "dense_tanh", "dense_relu"):
            raise ValueError(f"unknown classification head {kind!r}")
        self.dense = nn.Linear(d_model, d_model)
        self.activation = nn.ReLU() if kind == "dense_relu" else nn.Tanh()
        self.out = nn.Linear(d_model, num_labels)
        self.kind = kind

    def forward(self, hidden: Tensor) -> Tensor:
        first = hidden[:, 0]  # (B, d): [CLS] / <s>
        return self.out(self.activation(self.dense(first)))  # (B, num_labels)


class SequenceClassifier(nn.Module):
    """Encoder + classification head: a text (or a pair) -> one logit per label."""

    def __init__(self, cfg: EncoderConfig, num_labels: int, head: HeadKind) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.cfg = cfg
        self.num_labels = num_labels
        self.encoder = Encoder(cfg)
        self.head = ClassificationHead(cfg.d_model, num_labels, head)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        out = self.encoder(input_ids, attention_mask, token_type_ids, need_weights=need_weights)
        return self.head(out.hidden), out.attentions  # (B, num_labels)
