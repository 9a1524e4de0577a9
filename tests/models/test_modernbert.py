"""ModernBERT on the one encoder: parity with transformers' ModernBertModel and
ModernBertForSequenceClassification (eager attention), every layer and head.

Tiny: 4 layers (0 and 3 global, 1 and 2 local), d_model 64, 4 heads, local_attention 8 (four
keys on either side), so a 24-token input reaches past the window.
"""

from __future__ import annotations

import pytest
import torch

from models.families import encoder_config
from models.weights import load_pretrained
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
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "local_attention": 8,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 1000.0,
    "local_rope_theta": 100.0,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}
BIASED = {**CONFIG, "attention_bias": True, "mlp_bias": True, "norm_bias": True}
LENGTHS = {"short": [6, 4, 2], "long": [24, 17, 9]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert")
    return folder, save_checkpoint(folder, "ModernBertModel", "ModernBertConfig", **CONFIG)


def test_config_maps_windows_thetas_and_biases():
    cfg = encoder_config({**CONFIG, "model_type": "modernbert"})
    assert cfg.local_layers == (1, 2) and cfg.local_window == 4
    assert (cfg.rotary_theta, cfg.local_rotary_theta) == (1000.0, 100.0)
    assert (cfg.norm, cfg.ffn_kind, cfg.first_attn_norm) == ("pre", "geglu", False)
    assert not (cfg.attn_bias or cfg.ffn_bias or cfg.norm_bias)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_hidden_states_and_every_attention_map_match_transformers(checkpoint, length, side):
    folder, hf = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS[length], side)
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_local_layers_put_exactly_zero_probability_outside_the_window(checkpoint):
    folder, _ = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS["long"])
    _, attentions = ours(model, ids, mask)
    position = torch.arange(ids.shape[1])
    outside = (position[None, :] - position[:, None]).abs() > 4  # (N_q, N_k)
    for layer in (1, 2):  # every row, padding queries' included
        assert torch.all(attentions[layer][..., outside] == 0), layer
    real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # real query and key
    assert (attentions[0].masked_select(outside & real) > 0).all()  # global layers see all


def test_sentence_embedding_is_the_mean_of_transformers_tokens(checkpoint):
    folder, hf = checkpoint
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        pooled, _ = load_pretrained(folder).model(ids, mask)
    want = mean_pool(theirs(hf, ids, mask)[0], mask)
    assert (pooled - want).abs().max() < TOLERANCE


def test_sdpa_path_equals_explicit_path(checkpoint):
    folder, _ = checkpoint
    ids, mask = batch(LENGTHS["long"], "left")
    with torch.no_grad():
        explicit, _ = load_pretrained(folder).model(ids, mask)
        fast, _ = load_pretrained(folder, attention_impl="sdpa").model(ids, mask)
    assert (fast - explicit).abs().max() < 1e-5


def test_biases_are_loaded_when_the_config_has_them(tmp_path):
    hf = save_checkpoint(tmp_path, "ModernBertModel", "ModernBertConfig", **BIASED)
    loaded = load_pretrained(tmp_path)
    assert loaded.config.attn_bias and loaded.config.ffn_bias and loaded.config.norm_bias
    ids, mask = batch(LENGTHS["long"])
    diffs(*ours(loaded.model, ids, mask), *theirs(hf, ids, mask), mask).check()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classification_logits_match_transformers(tmp_path, pooling):
    hf = save_checkpoint(
        tmp_path,
        "ModernBertForSequenceClassification",
        "ModernBertConfig",
        **CONFIG,
        num_labels=3,
        classifier_pooling=pooling,
    )
    loaded = load_pretrained(tmp_path)
    assert (loaded.task, loaded.config.pooling) == ("classify", pooling)
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        logits, _ = loaded.model(ids, mask)
        want = hf(input_ids=ids, attention_mask=mask).logits
    assert (logits - want).abs().max() < TOLERANCE
