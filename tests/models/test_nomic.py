"""NomicBERT in both dialects on the one encoder.

- transformers 5's NomicBertModel (eager): parity on every layer and head, with plain and
  dynamic-NTK rotary.
- the remote code's config and tensor layout (nomic-embed-text-v1.5): parity with
  transformers' NomicBertModel on the same weights renamed, where the two coincide (full
  rotary, no biases); and with the remote code's math written out (tests/models/nomic_remote.py)
  for what transformers lacks: partial rotary, q/k/v/out and MLP biases, rotary_scaling_factor,
  a gated MLP width rounded up to 256, a vocabulary padded to pad_vocab_size_multiple.
"""

from __future__ import annotations

import pytest
import torch

from models.families import NOMIC, NOMIC_REMOTE, encoder_config, family_of
from models.weights import load_pretrained
from tests.models import nomic_remote
from tests.models.checkpoints import (
    TOLERANCE,
    batch,
    diffs,
    mean_pool,
    ours,
    save_checkpoint,
    theirs,
)

CONFIG = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
}
# Trained on 16 positions, NTK-stretched by 2: a 24-token input is past the trained length.
DYNAMIC = {
    **CONFIG,
    "max_position_embeddings": 16,
    "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0},
}
LENGTHS = {"short": [6, 4, 2], "long": [24, 17, 9]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nomic")
    return folder, save_checkpoint(folder, "NomicBertModel", "NomicBertConfig", **CONFIG)


def test_each_dialect_is_recognised_by_its_keys():
    assert family_of({**CONFIG, "model_type": "nomic_bert"}) is NOMIC
    assert family_of(nomic_remote.remote_config()) is NOMIC_REMOTE
    cfg = encoder_config(nomic_remote.remote_config(n_inner=200, rotary_emb_fraction=0.5))
    assert (cfg.d_ff, cfg.rotary_fraction, cfg.vocab_size) == (256, 0.5, 128)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_hidden_states_and_every_attention_map_match_transformers(checkpoint, length, side):
    folder, hf = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS[length], side)
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_sdpa_path_equals_explicit_path(checkpoint):
    folder, _ = checkpoint
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        explicit, _ = load_pretrained(folder).model(ids, mask)
        fast, _ = load_pretrained(folder, attention_impl="sdpa").model(ids, mask)
    assert (fast - explicit).abs().max() < 1e-5


@pytest.mark.parametrize("length", list(LENGTHS))
def test_dynamic_ntk_rotary_matches_transformers_within_and_past_the_trained_length(
    tmp_path, length
):
    # A fresh transformers model per length: its dynamic rotary caches the longest length seen.
    hf = save_checkpoint(tmp_path, "NomicBertModel", "NomicBertConfig", **DYNAMIC)
    loaded = load_pretrained(tmp_path)
    assert loaded.config.rotary_scaling_factor == 2.0 and loaded.max_length == 32
    ids, mask = batch(LENGTHS[length])
    diffs(*ours(loaded.model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_remote_layout_matches_transformers_on_the_same_weights(checkpoint, tmp_path):
    _, hf = checkpoint
    cfg = nomic_remote.remote_config(
        n_inner=CONFIG["intermediate_size"], rotary_emb_base=500, pad_vocab_size_multiple=1
    )
    state = nomic_remote.from_transformers(hf.state_dict())
    # transformers' MLP is 96 wide; the remote one would round that to 256: pad with zeros.
    for name in [n for n in state if ".mlp." in n]:
        w = state[name]
        padded = torch.zeros(256, w.shape[1]) if "fc2" not in name else torch.zeros(64, 256)
        padded[: w.shape[0], : w.shape[1]] = w
        state[name] = padded
    folder = nomic_remote.save_remote(tmp_path / "remote", cfg, state)
    ids, mask = batch(LENGTHS["long"])
    diffs(*ours(load_pretrained(folder).model, ids, mask), *theirs(hf, ids, mask), mask).check()


REMOTE_FEATURES = {
    "rotary_emb_fraction": 0.5,
    "qkv_proj_bias": True,
    "mlp_fc1_bias": True,
    "mlp_fc2_bias": True,
    "n_inner": 200,
    "rotary_scaling_factor": 2.0,
    "max_trained_positions": 16,
    "pad_vocab_size_multiple": 64,
}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_remote_features_match_the_remote_codes_math(tmp_path, length, side):
    cfg = nomic_remote.remote_config(**REMOTE_FEATURES)
    state = nomic_remote.random_state(cfg)
    folder = nomic_remote.save_remote(tmp_path, cfg, state)
    ids, mask = batch(LENGTHS[length], side)
    want = nomic_remote.reference(cfg, state, ids, mask)
    diffs(*ours(load_pretrained(folder).model, ids, mask), *want, mask).check()


@pytest.mark.parametrize(
    "change",
    [
        {"prenorm": True},
        {"rotary_emb_interleaved": True},
        {"rotary_emb_scale_base": 512},
        {"activation_function": "gelu"},
        {"rotary_emb_fraction": 0.0},
    ],
)
def test_remote_switches_headwise_does_not_reproduce_are_refused_by_name(change):
    key = next(iter(change))
    with pytest.raises(ValueError, match=key):
        encoder_config(nomic_remote.remote_config(**change))


def test_sentence_embedding_is_the_mean_of_transformers_tokens(checkpoint):
    folder, hf = checkpoint
    ids, mask = batch(LENGTHS["long"], "left")
    with torch.no_grad():
        pooled, _ = load_pretrained(folder).model(ids, mask)
    assert (pooled - mean_pool(theirs(hf, ids, mask)[0], mask)).abs().max() < TOLERANCE


def test_sequence_classification_logits_match_transformers(tmp_path):
    hf = save_checkpoint(
        tmp_path, "NomicBertForSequenceClassification", "NomicBertConfig", **CONFIG, num_labels=3
    )
    loaded = load_pretrained(tmp_path)
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        logits, _ = loaded.model(ids, mask)
        want = hf(input_ids=ids, attention_mask=mask).logits
    assert loaded.task == "classify" and (logits - want).abs().max() < TOLERANCE
