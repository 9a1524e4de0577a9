"""Gemma 3 text as a bidirectional encoder (EmbeddingGemma) on the one encoder: parity with
transformers' Gemma3TextModel (use_bidirectional_attention, eager) on every layer and head,
and EmbeddingGemma's sentence-transformers pipeline (mean, Dense, Dense, Normalize).

Tiny: 4 layers (sliding, sliding, global, sliding), d_model 48, 4 query heads sharing 2 kv
heads of size 16 (head size × heads != d_model), query_pre_attn_scalar 24, sliding_window 8.
"""

from __future__ import annotations

import json

import pytest
import torch

from models.families import encoder_config
from models.st_modules import read_config
from models.weights import load_pretrained
from tests.models.checkpoints import (
    TOLERANCE,
    batch,
    diffs,
    mean_pool,
    ours,
    save_checkpoint,
    theirs,
    write_st_modules,
    write_tokenizer,
)

CONFIG = {
    "vocab_size": 100,
    "hidden_size": 48,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 8,
    "sliding_window_pattern": 3,
    "use_bidirectional_attention": True,
    "query_pre_attn_scalar": 24,
    "rope_theta": 1000.0,
    "rope_local_base_freq": 100.0,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
LENGTHS = {"short": [6, 4, 2], "long": [24, 17, 9]}
NO_CACHE = {"use_cache": False}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    return folder, save_checkpoint(folder, "Gemma3TextModel", "Gemma3TextConfig", **CONFIG)


def test_config_maps_grouped_heads_scale_windows_and_thetas(checkpoint):
    folder, _ = checkpoint
    cfg = load_pretrained(folder).config
    assert (cfg.n_heads, cfg.kv_heads, cfg.d_k, cfg.scale_dim) == (4, 2, 16, 24)
    assert cfg.local_layers == (0, 1, 3) and cfg.local_window == 4
    assert (cfg.rotary_theta, cfg.local_rotary_theta) == (1000.0, 100.0)
    assert (cfg.norm, cfg.norm_kind, cfg.ffn_kind) == ("sandwich", "rms_offset", "geglu_tanh")


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_hidden_states_and_every_attention_map_match_transformers(checkpoint, length, side):
    folder, hf = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS[length], side)
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask, **NO_CACHE), mask).check()


def test_sliding_layers_see_half_the_window_on_either_side(checkpoint):
    folder, hf = checkpoint
    ids, mask = batch([24])
    _, attentions = theirs(hf, ids, mask, **NO_CACHE)
    _, mine = ours(load_pretrained(folder).model, ids, mask)
    position = torch.arange(24)
    outside = (position[None, :] - position[:, None]).abs() > 4
    for layer in (0, 1, 3):
        assert torch.all(attentions[layer][..., outside] == 0)  # transformers' own band
        assert torch.all(mine[layer][..., outside] == 0)
        assert torch.all(mine[layer][..., ~outside] > 0)


def test_sdpa_path_equals_explicit_path(checkpoint):
    folder, _ = checkpoint
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        explicit, _ = load_pretrained(folder).model(ids, mask)
        fast, _ = load_pretrained(folder, attention_impl="sdpa").model(ids, mask)
    assert (fast - explicit).abs().max() < 1e-5


def test_attention_soft_capping_is_refused_as_transformers_gemma3_ignores_it():
    # Gemma3Attention keeps attn_logit_softcapping but never hands it to the attention.
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        encoder_config({**CONFIG, "model_type": "gemma3_text", "attn_logit_softcapping": 50.0})


def test_a_causal_gemma_is_refused():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        encoder_config({**CONFIG, "model_type": "gemma3_text", "use_bidirectional_attention": 0})


def test_a_sequence_classification_checkpoint_is_refused_by_family(tmp_path):
    hf = {**CONFIG, "model_type": "gemma3_text"}
    hf["architectures"] = ["Gemma3ForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    write_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="gemma3: sequence-classification"):
        load_pretrained(tmp_path)


def embeddinggemma_folder(folder):
    """The checkpoint plus EmbeddingGemma's modules: mean pooling, 48 -> 96 -> 48 linear Dense
    modules (its real ones are 768 -> 3072 -> 768), Normalize."""
    from sentence_transformers.models import Dense

    torch.manual_seed(1)
    for path, (i, o) in (("2_Dense", (48, 96)), ("3_Dense", (96, 48))):
        dense = Dense(i, o, bias=False, activation_function=torch.nn.Identity())
        torch.nn.init.normal_(dense.linear.weight, std=0.1)
        (folder / path).mkdir()
        dense.save(str(folder / path))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(
        json.dumps({"word_embedding_dimension": 48, "pooling_mode_mean_tokens": True})
    )
    modules = [("Transformer", ""), ("Pooling", "1_Pooling"), ("Dense", "2_Dense")]
    write_st_modules(folder, [*modules, ("Dense", "3_Dense"), ("Normalize", "4_Normalize")])
    return folder


def test_embeddinggemma_pipeline_pools_projects_and_normalises_as_sentence_transformers(
    checkpoint, tmp_path
):
    import shutil

    from sentence_transformers.models import Dense

    folder = embeddinggemma_folder(shutil.copytree(checkpoint[0], tmp_path / "st"))
    loaded = load_pretrained(folder)
    assert loaded.config.dense_layers == ((48, 96, False), (96, 48, False))
    assert loaded.normalize and loaded.config.embedding_dim == 48
    ids, mask = batch(LENGTHS["long"])
    with torch.no_grad():
        got, _ = loaded.model(ids, mask, normalize=True)
        x = mean_pool(theirs(checkpoint[1], ids, mask, **NO_CACHE)[0], mask)
        for path in ("2_Dense", "3_Dense"):  # sentence-transformers' own modules, loaded
            x = Dense.load(str(folder / path))({"sentence_embedding": x})["sentence_embedding"]
        want = torch.nn.functional.normalize(x, dim=-1)
    assert (got - want).abs().max() < TOLERANCE


def test_a_dense_module_with_an_activation_is_refused_by_name(tmp_path):
    folder = tmp_path
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense/config.json").write_text(
        json.dumps({"in_features": 4, "out_features": 4, "bias": True})  # default: Tanh
    )
    write_st_modules(folder, [("Pooling", "1_Pooling"), ("Dense", "2_Dense")])
    with pytest.raises(ValueError, match="Tanh"):
        read_config(folder)
