"""What tells the families apart is configuration: config.json translation, tensor names,
position numbering, MPNet's relative bias, and the pooling modes."""

from __future__ import annotations

import pytest
import torch

from models.families import BERT, DISTILBERT, MPNET, ROBERTA, encoder_config, family_of
from models.pooling import last_token_pool
from models.positions import position_ids, relative_bucket
from models.weights import load_pretrained
from tests.models import test_deberta, test_gemma, test_modernbert, test_nomic
from tests.models.checkpoints import batch, save_checkpoint

BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
}


def test_roberta_positions_start_after_padding_and_it_has_one_token_type():
    cfg = encoder_config(
        {
            **BASE,
            "model_type": "xlm-roberta",
            "pad_token_id": 1,
            "max_position_embeddings": 514,
            "type_vocab_size": 1,
        }
    )
    assert (cfg.architecture, cfg.position_offset, cfg.pad_token_id) == ("xlm-roberta", 2, 1)
    assert cfg.max_length == 512 and not cfg.token_types


def test_distilbert_config_uses_its_own_keys_and_has_no_token_types():
    cfg = encoder_config(
        {
            "model_type": "distilbert",
            "vocab_size": 100,
            "dim": 32,
            "n_heads": 4,
            "n_layers": 2,
            "hidden_dim": 64,
        }
    )
    assert (cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.type_vocab_size) == (32, 2, 64, 0)


def test_mpnet_has_relative_attention_buckets():
    cfg = encoder_config({**BASE, "model_type": "mpnet", "pad_token_id": 1})
    assert cfg.relative_attention_buckets == 32 and cfg.type_vocab_size == 0
    assert cfg.position_offset == 2


def test_an_unknown_model_type_is_named():
    with pytest.raises(ValueError, match="'xlnet'.*'deberta-v2'"):
        family_of({"model_type": "xlnet"})


@pytest.mark.parametrize(
    ("family", "theirs", "ours"),
    [
        (
            BERT,
            "bert.encoder.layer.0.attention.self.query.weight",
            "encoder.layers.0.attn.q_proj.weight",
        ),
        (ROBERTA, "roberta.encoder.layer.1.output.LayerNorm.bias", "encoder.layers.1.norm2.bias"),
        (ROBERTA, "embeddings.word_embeddings.weight", "encoder.embeddings.tokens.weight"),
        (
            DISTILBERT,
            "distilbert.transformer.layer.1.attention.out_lin.weight",
            "encoder.layers.1.attn.out_proj.weight",
        ),
        (DISTILBERT, "transformer.layer.0.sa_layer_norm.bias", "encoder.layers.0.norm1.bias"),
        (DISTILBERT, "transformer.layer.0.ffn.lin2.weight", "encoder.layers.0.ffn.fc2.weight"),
        (
            MPNET,
            "mpnet.encoder.layer.0.attention.attn.o.weight",
            "encoder.layers.0.attn.out_proj.weight",
        ),
        (MPNET, "encoder.relative_attention_bias.weight", "encoder.relative_bias.table.weight"),
    ],
)
def test_checkpoint_names_map_onto_the_one_encoder(family, theirs, ours):
    assert family.to_ours(theirs, with_head=False) == ours


@pytest.mark.parametrize(
    ("family", "theirs", "ours"),
    [
        (BERT, "bert.pooler.dense.weight", "head.dense.weight"),
        (BERT, "classifier.bias", "head.out.bias"),
        (ROBERTA, "classifier.out_proj.weight", "head.out.weight"),
        (DISTILBERT, "pre_classifier.weight", "head.dense.weight"),
    ],
)
def test_classification_heads_map_only_when_wanted(family, theirs, ours):
    assert family.to_ours(theirs, with_head=True) == ours
    assert family.to_ours(theirs, with_head=False) is None


def test_roberta_position_ids_count_real_tokens_after_the_padding_index():
    ids = torch.tensor([[0, 5, 6, 2, 1, 1]])  # <s> a b </s> <pad> <pad>
    assert position_ids(ids, offset=2, pad_token_id=1).tolist() == [[2, 3, 4, 5, 1, 1]]
    assert position_ids(ids, offset=0, pad_token_id=0).tolist() == [[0, 1, 2, 3, 4, 5]]


def test_relative_buckets_equal_mpnet_reference():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    pos = torch.arange(300)
    relative = pos[None, :] - pos[:, None]
    want = MPNetEncoder.relative_position_bucket(relative, num_buckets=32, max_distance=128)
    assert torch.equal(relative_bucket(relative, 32, 128), want)


def test_last_token_pooling_follows_the_mask_on_either_side():
    hidden = torch.arange(2 * 4, dtype=torch.float32).view(2, 4, 1)  # (B, N, d=1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    assert last_token_pool(hidden, right)[:, 0].tolist() == [1.0, 7.0]
    assert last_token_pool(hidden, left)[:, 0].tolist() == [3.0, 7.0]


# Pre-training checkpoints (what the Hub mostly holds) load as embedders: the task head is
# skipped by name and the base model's prefix stripped. family -> (class, config, base attr).
PRETRAINING = {
    "modernbert": ("ModernBertForMaskedLM", "ModernBertConfig", "model", test_modernbert),
    "nomic-bert": ("NomicBertForMaskedLM", "NomicBertConfig", "nomic_bert", test_nomic),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", "model", test_gemma),
    "deberta-v2": ("DebertaV2ForMaskedLM", "DebertaV2Config", "deberta", test_deberta),
}


@pytest.mark.parametrize("family", list(PRETRAINING))
def test_pretraining_checkpoints_load_as_their_base_encoder(family, tmp_path):
    model_class, config_class, base, tests = PRETRAINING[family]
    hf = save_checkpoint(tmp_path, model_class, config_class, **tests.CONFIG)
    loaded = load_pretrained(tmp_path)
    assert (loaded.config.architecture, loaded.task) == (family, "embed")
    ids, mask = batch([12, 7])
    extra = {"use_cache": False} if family == "gemma3" else {}
    with torch.no_grad():
        want = getattr(hf, base)(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
        got = loaded.model.encoder(ids, mask).hidden
    assert (got - want)[mask.bool()].abs().max() < 1e-4
