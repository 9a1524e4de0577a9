"""Shared fixtures: a tiny random-weight bundle (seconds) and the real default bundle."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

REAL_TEXTS = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome, I loved every minute of it!",
    "Le chat dort sur le canapé depuis ce matin.",
    "量子コンピュータは従来のコンピュータとは異なる原理で動作する。",
    "Can I return these shoes if they don't fit? 👟",
    "",
    "Transformers use self-attention to relate every token to every other token. " * 30,
]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from models.weights import default_model_dir

    return default_model_dir()


def tiny_loaded(model_dir: Path, seed: int = 0, **overrides):
    """A 2-layer, 4-head, d_model 32 encoder with random weights and the real tokenizer."""
    import torch

    from models.config import EncoderConfig
    from models.encoder import SentenceEncoder
    from models.weights import LoadedModel

    torch.manual_seed(seed)
    cfg = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_positions=64,
        dropout=0.0,
        attn_dropout=0.0,
        **overrides,
    )
    model = SentenceEncoder(cfg).eval()
    return LoadedModel(
        model=model,
        config=cfg,
        name="tiny-random",
        source=Path("random"),
        max_length=48,
        normalize=True,
        tokenizer_path=model_dir / "tokenizer.json",
    )


@pytest.fixture(scope="session")
def tiny_model(model_dir: Path):
    return tiny_loaded(model_dir)


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> Path:
    from export.bundle import ExportOptions, build_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny"
    build_bundle(tiny_model, out, ExportOptions(fp16=True, int8=True))
    return out


@pytest.fixture(scope="session")
def default_loaded(model_dir: Path):
    from models.weights import DEFAULT_MODEL_NAME, load_pretrained

    return load_pretrained(model_dir, name=DEFAULT_MODEL_NAME)


@pytest.fixture(scope="session")
def default_bundle(tmp_path_factory: pytest.TempPathFactory, default_loaded) -> Path:
    from export.bundle import build_bundle

    out = tmp_path_factory.mktemp("bundles") / "default"
    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    build_bundle(default_loaded, out)
    return out


@pytest.fixture(scope="session")
def sentence_transformer(model_dir: Path):
    """The independent reference: sentence-transformers' own all-MiniLM-L6-v2 pipeline."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")
