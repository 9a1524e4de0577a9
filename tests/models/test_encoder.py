"""The encoder: configuration, variants, and parity with sentence-transformers on real weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from models.config import EncoderConfig
from models.encoder import SentenceEncoder
from models.positions import sinusoidal_table
from tests.conftest import REAL_TEXTS


def test_config_rejects_indivisible_heads():
    with pytest.raises(ValueError, match=r"d_model \(100\).*n_heads \(12\)"):
        EncoderConfig(d_model=100, n_heads=12)


@pytest.mark.parametrize(
    "field,value",
    [
        ("n_layers", 0),
        ("dropout", 1.5),
        ("positions", "alibi"),
        ("pooling", "max"),
        ("norm", "middle"),
    ],
)
def test_config_rejects_bad_values_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        EncoderConfig(**{field: value})


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_variants_run_and_respect_padding(norm, positions, pooling):
    torch.manual_seed(0)
    cfg = EncoderConfig(
        vocab_size=50,
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=32,
        max_positions=20,
        dropout=0.0,
        attn_dropout=0.0,
        norm=norm,
        positions=positions,
        pooling=pooling,
    )
    model = SentenceEncoder(cfg).eval()
    ids = torch.tensor([[2, 5, 7, 9, 0, 0], [3, 4, 0, 0, 0, 0]])
    mask = (ids > 0).long()
    pooled, attn = model(ids, mask, need_weights=True)
    assert pooled.shape == (2, 16)
    assert len(attn) == 2 and attn[0].shape == (2, 2, 6, 6)
    # Padding never changes a text's vector: same as encoding the text alone.
    alone, _ = model(ids[1:, :2], mask[1:, :2])
    torch.testing.assert_close(pooled[1:], alone, atol=1e-5, rtol=1e-5)


def test_sinusoidal_table_follows_the_paper():
    t = sinusoidal_table(10, 8)
    assert torch.allclose(t[3, 0], torch.sin(torch.tensor(3.0)))
    assert torch.allclose(t[3, 1], torch.cos(torch.tensor(3.0)))
    assert torch.allclose(t[3, 2], torch.sin(torch.tensor(3.0 / 10000 ** (2 / 8))))


def test_sdpa_and_explicit_encoders_agree(default_loaded):
    fast = SentenceEncoder(default_loaded.config.replace(attention_impl="sdpa")).eval()
    fast.load_state_dict(default_loaded.model.state_dict())
    tok = Tokenizer.from_file(str(default_loaded.tokenizer_path))
    tok.enable_truncation(256)
    tok.enable_padding()
    enc = tok.encode_batch(REAL_TEXTS)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        a, _ = default_loaded.model(ids, mask)
        b, _ = fast(ids, mask)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_matches_sentence_transformers(default_loaded, sentence_transformer):
    """Independent reference: sentence-transformers on the same weights, max length 256."""
    assert default_loaded.max_length == 256 == sentence_transformer.max_seq_length
    tok = Tokenizer.from_file(str(default_loaded.tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(default_loaded.max_length)
    tok.enable_padding()
    enc = tok.encode_batch(REAL_TEXTS)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        ours, _ = default_loaded.model(ids, mask, normalize=True)
    ref = sentence_transformer.encode(REAL_TEXTS, convert_to_numpy=True)
    cos = (ours.numpy() * ref).sum(-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() >= 0.99999, cos
    assert np.abs(ours.numpy() - ref).max() < 1e-5
