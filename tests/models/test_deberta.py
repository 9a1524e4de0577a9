"""DeBERTa-v2/v3 on the one encoder: parity with transformers' DebertaV2Model and
DebertaV2ForSequenceClassification (eager), every layer and head.

deberta-v3-shaped tiny config: 3 layers, d_model 64, 4 heads, relative attention with 8
log buckets (distances past 4 share buckets) over max_relative_positions 64, shared keys,
LayerNorm'd relative embeddings, p2c|c2p, no absolute positions.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.families import encoder_config
from models.weights import load_pretrained
from tests.models.checkpoints import TOLERANCE, batch, diffs, ours, save_checkpoint, theirs

CONFIG = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "relative_attention": True,
    "position_buckets": 8,
    "max_relative_positions": -1,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "position_biased_input": False,
    "type_vocab_size": 0,
    "pad_token_id": 0,
}
# DeBERTa-v2 without v3's choices: own position projections, unbucketed distances clamped
# at 8, absolute positions added to the input, token types, no norm on the relative table.
UNSHARED = {
    **CONFIG,
    "share_att_key": False,
    "position_buckets": -1,
    "max_relative_positions": 8,
    "position_biased_input": True,
    "norm_rel_ebd": "none",
    "type_vocab_size": 2,
}
LENGTHS = {"short": [6, 4, 2], "long": [24, 17, 9]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deberta")
    return folder, save_checkpoint(folder, "DebertaV2Model", "DebertaV2Config", **CONFIG)


def test_config_maps_the_disentangled_attention():
    cfg = encoder_config({**CONFIG, "model_type": "deberta-v2"})
    assert cfg.disentangled == ("c2p", "p2c") and cfg.scale_dim == 16 * 3
    assert (cfg.position_buckets, cfg.max_relative_positions, cfg.relative_span) == (8, 64, 8)
    assert cfg.share_att_key and cfg.norm_rel_embeddings and cfg.positions == "none"


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_hidden_states_and_every_attention_map_match_transformers(checkpoint, length, side):
    folder, hf = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS[length], side)
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_own_position_projections_clamped_distances_and_absolute_positions_match(tmp_path):
    hf = save_checkpoint(tmp_path, "DebertaV2Model", "DebertaV2Config", **UNSHARED)
    model = load_pretrained(tmp_path).model
    ids, mask = batch(LENGTHS["long"])
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_sdpa_path_equals_explicit_path(checkpoint):
    folder, _ = checkpoint
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        explicit, _ = load_pretrained(folder).model(ids, mask)
        fast, _ = load_pretrained(folder, attention_impl="sdpa").model(ids, mask)
    assert (fast - explicit).abs().max() < 1e-5


@pytest.mark.parametrize("labels", [1, 3])
def test_sequence_classification_logits_match_transformers(tmp_path, labels):
    hf = save_checkpoint(
        tmp_path,
        "DebertaV2ForSequenceClassification",
        "DebertaV2Config",
        **CONFIG,
        num_labels=labels,
    )
    loaded = load_pretrained(tmp_path)
    assert loaded.task == ("rerank" if labels == 1 else "classify")
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        logits, _ = loaded.model(ids, mask)
        want = hf(input_ids=ids, attention_mask=mask).logits
    assert (logits - want).abs().max() < TOLERANCE


def test_a_v3_checkpoints_unused_absolute_position_table_is_skipped(checkpoint, tmp_path):
    folder, _ = checkpoint
    import shutil

    copy = shutil.copytree(folder, tmp_path / "v3")
    state = load_file(str(copy / "model.safetensors"))
    state["embeddings.position_embeddings.weight"] = torch.zeros(64, 64)
    save_file(state, str(copy / "model.safetensors"))
    assert load_pretrained(copy).config.positions == "none"


def test_the_first_layers_convolution_is_refused_by_name():
    with pytest.raises(ValueError, match="conv_kernel_size"):
        encoder_config({**CONFIG, "model_type": "deberta-v2", "conv_kernel_size": 3})
