"""torch.onnx.export of the two graphs, with dynamic batch and sequence axes."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from models.encoder import SentenceEncoder

log = logging.getLogger(__name__)

OPSET = 17
INPUTS = ["input_ids", "attention_mask"]
DYNAMIC = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}


class ServingGraph(nn.Module):
    """ids, mask -> pooled sentence embedding, not normalised (normalisation is per request)."""

    def __init__(self, model: SentenceEncoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        pooled, _ = self.model(input_ids, attention_mask)
        return pooled  # (B, d)


class AttentionGraph(nn.Module):
    """ids, mask -> pooled embedding and every layer's softmax probabilities (L, B, h, N, N)."""

    def __init__(self, model: SentenceEncoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        pooled, attentions = self.model(input_ids, attention_mask, need_weights=True)
        return pooled, torch.stack(attentions)  # (B, d), (L, B, h, N, N)


def _sample_inputs(vocab_size: int) -> tuple[Tensor, Tensor]:
    ids = torch.randint(1000 % vocab_size, vocab_size, (2, 9), dtype=torch.int64)
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[1, 6:] = 0
    return ids, mask


def _export(
    module: nn.Module, vocab_size: int, path: Path, outputs: list[str], dynamic: dict
) -> None:
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter is the one whose graph shape ONNX Runtime's BERT fusion
        # matches; it warns that it is deprecated.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            _sample_inputs(vocab_size),
            str(path),
            input_names=INPUTS,
            output_names=outputs,
            dynamic_axes={**DYNAMIC, **dynamic},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    log.info("exported %s", path)


def export_serving(model: SentenceEncoder, path: Path) -> None:
    if model.cfg.attention_impl != "explicit":
        raise ValueError("export needs the explicit attention path: its shape is what ORT fuses")
    _export(
        ServingGraph(model),
        model.cfg.vocab_size,
        path,
        ["sentence_embedding"],
        {"sentence_embedding": {0: "batch"}},
    )


def export_attention(model: SentenceEncoder, path: Path) -> None:
    _export(
        AttentionGraph(model),
        model.cfg.vocab_size,
        path,
        ["sentence_embedding", "attentions"],
        {
            "sentence_embedding": {0: "batch"},
            "attentions": {1: "batch", 3: "sequence", 4: "sequence_k"},
        },
    )
