"""Random-weight checkpoints shaped as the models with sparse and multi-vector outputs ship,
saved with transformers' own classes (tiny: 2 layers, d_model 32), each with its own files:

- bge-m3: an XLM-RoBERTa model, FlagEmbedding's sparse_linear.pt and colbert_linear.pt beside
  it, and sentence-transformers' Transformer -> Pooling (cls) -> Normalize.
- SPLADE: a BertForMaskedLM, bare (exported with --task sparse) or with a SparseEncoder's
  modules.json (MLMTransformer -> SpladePooling).
- ColBERT: a BertModel in PyLate's layout: modules.json (Transformer, pylate.models.Dense.Dense
  in 1_Dense/), config_sentence_transformers.json with PyLate's query/document settings, and
  the marker tokens in the tokenizer.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer

from tests.export.test_architectures import save_checkpoint, write_st_modules

COLBERT_DIM = 24  # the token vectors' width, unlike d_model (32), as real models have it


def _modules(folder: Path, entries: list[tuple[str, str]]) -> None:
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": kind}
        for i, (kind, path) in enumerate(entries)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))


def m3_checkpoint(
    folder: Path, tokenizer: Path, colbert_dim: int = COLBERT_DIM, **extra: int
) -> Path:
    """extra: XLM-R config values over the tiny family's (a wider hidden_size widens the
    sparse and ColBERT heads with it)."""
    save_checkpoint(folder, "xlm-roberta", tokenizer, **extra)
    width = extra.get("hidden_size", 32)
    torch.manual_seed(1)
    torch.save(torch.nn.Linear(width, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(width, colbert_dim).state_dict(), folder / "colbert_linear.pt")
    write_st_modules(folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": width, "pooling_mode_cls_token": True})
    )
    return folder


def splade_checkpoint(folder: Path, tokenizer: Path, modules: bool = True, **pooling) -> Path:
    """pooling: SpladePooling's config (pooling_strategy, activation_function)."""
    save_checkpoint(folder, "bert", tokenizer, "ForMaskedLM")
    if modules:
        _modules(
            folder,
            [
                ("sentence_transformers.sparse_encoder.models.MLMTransformer", ""),
                ("sentence_transformers.sparse_encoder.models.SpladePooling", "1_SpladePooling"),
            ],
        )
        (folder / "1_SpladePooling").mkdir()
        config = {"pooling_strategy": "max", "activation_function": "relu", **pooling}
        (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(config))
        (folder / "config_sentence_transformers.json").write_text(
            json.dumps({"model_type": "SparseEncoder", "prompts": {}, "default_prompt_name": None})
        )
    return folder


def colbert_tokenizer(tokenizer: Path, out: Path, markers: tuple[str, ...]) -> Path:
    """The family's tokenizer with PyLate's marker tokens added (as PyLate adds them)."""
    tok = Tokenizer.from_file(str(tokenizer))
    tok.add_special_tokens([AddedToken(m, normalized=False) for m in markers])
    tok.save(str(out))
    return out


def colbert_checkpoint(
    folder: Path,
    tokenizer: Path,
    settings: dict | None = None,
    markers: tuple[str, str] = ("[unused0]", "[unused1]"),
) -> Path:
    """settings: config_sentence_transformers.json's PyLate keys (defaults: PyLate's)."""
    folder.mkdir(parents=True)
    tok = colbert_tokenizer(tokenizer, folder / "marked.json", markers)
    save_checkpoint(folder, "bert", tok)
    (folder / "marked.json").unlink()
    _modules(
        folder,
        [("sentence_transformers.models.Transformer", ""), ("pylate.models.Dense.Dense", "1_Dense")],
    )
    dense = folder / "1_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": 32,
                "out_features": COLBERT_DIM,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
                "use_residual": False,
            }
        )
    )
    g = torch.Generator().manual_seed(2)
    save_file({"linear.weight": torch.randn(COLBERT_DIM, 32, generator=g) * 0.2}, dense / "model.safetensors")
    config = {
        "query_prefix": markers[0],
        "document_prefix": markers[1],
        "query_length": 16,
        "document_length": 24,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        "similarity_fn_name": "MaxSim",
        **(settings or {}),
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    return folder
