"""A checkpoint past 2 GiB, made in seconds: a 2-layer, 64-wide BERT whose vocabulary (8.7M rows,
2.2 GB of float32) is what makes it large. The tokenizer is a small WordPiece one: ids past its
vocabulary are never fed, and the table's size is all the export has to carry.

Built in a process of its own (`python -m tests.export.large FOLDER TOKENIZER`), with
transformers' mean-pooled embeddings of TEXTS written beside the folder (reference.npy), so
that the caller never holds the weights.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import torch

VOCAB = 8_700_000
CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
}
TEXTS = ["the cat sat on a warm mat", "le chat dort sur le canapé", "", "rain fell " * 80]


def build(folder: Path, tokenizer: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(**CONFIG), add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # std 0.1 in place (no second copy); norm scales around 1
        for name, p in model.named_parameters():
            p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.1, generator=g)
    model.save_pretrained(folder)
    shutil.copy(tokenizer, folder / "tokenizer.json")
    tok = Tokenizer.from_file(str(tokenizer))
    tok.enable_truncation(CONFIG["max_position_embeddings"])
    reference = []
    for enc in tok.encode_batch(TEXTS):  # one at a time: no padding
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([enc.ids])).last_hidden_state[0]
        reference.append(hidden.mean(0).numpy())
    np.save(folder.parent / "reference.npy", np.stack(reference))


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]))
