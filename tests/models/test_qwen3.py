"""Qwen3 as a decoder on the one stack: parity with transformers' Qwen3Model (eager) on the
last hidden state and every layer's attention map, causal (above the diagonal exactly 0), with
left and right padding; Qwen3ForSequenceClassification's logits; a Qwen3ForCausalLM read as a
yes/no reranker (P(yes) = softmax over the last position's "no" and "yes" logits); sharded and
half-precision checkpoints.

Tiny: 2 layers, d_model 32, 4 query heads sharing 2 kv heads of size 16 (heads × size != d).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from models.weights import WeightLoadError, load_pretrained, read_state_dict
from tests.models.checkpoints import TOLERANCE, batch, diffs, ours, save_checkpoint, theirs

CONFIG = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "rope_theta": 1000.0,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
LENGTHS = {"short": [6, 4, 1], "long": [30, 17, 9]}
YES, NO = 7, 8  # the word-level tokenizer's ids of "yes" and "no"
NO_CACHE = {"use_cache": False}


def write_tokenizer(folder, yes_no: bool = True) -> None:
    vocab = {"<pad>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, CONFIG["vocab_size"])}}
    if yes_no:
        vocab = {k: v for k, v in vocab.items() if v not in (YES, NO)} | {"yes": YES, "no": NO}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def save(folder, model_class: str = "Qwen3Model", yes_no: bool = True, **extra):
    hf = save_checkpoint(folder, model_class, "Qwen3Config", **{**CONFIG, **extra})
    write_tokenizer(folder, yes_no)
    return hf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3")
    return folder, save(folder)


def test_config_maps_a_causal_pre_norm_decoder_with_grouped_normed_heads(checkpoint):
    cfg = load_pretrained(checkpoint[0]).config
    assert cfg.causal and cfg.architecture == "qwen3"
    assert (cfg.n_heads, cfg.kv_heads, cfg.d_k, cfg.scale_dim or cfg.d_k) == (4, 2, 16, 16)
    assert (cfg.norm, cfg.norm_kind, cfg.ffn_kind, cfg.qk_norm) == ("pre", "rms", "swiglu", True)
    assert (cfg.positions, cfg.rotary_theta, cfg.embedding_norm) == ("rotary", 1000.0, False)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("length", list(LENGTHS))
def test_hidden_states_and_every_attention_map_match_transformers(checkpoint, length, side):
    folder, hf = checkpoint
    model = load_pretrained(folder).model
    ids, mask = batch(LENGTHS[length], side)
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask, **NO_CACHE), mask).check()


def test_attention_above_the_diagonal_is_exactly_zero(checkpoint):
    model = load_pretrained(checkpoint[0]).model
    ids, mask = batch(LENGTHS["long"])
    _, attentions = ours(model, ids, mask)
    above = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).triu(1)
    for layer in attentions:  # (B, h, N, N)
        assert (layer[..., above] == 0).all()


def test_right_padding_leaves_a_texts_vectors_as_they_are_alone(checkpoint):
    """Causal attention never looks ahead, so trailing padding changes nothing before it."""
    model = load_pretrained(checkpoint[0]).model
    ids, mask = batch([12, 5])
    alone, _ = ours(model, ids[1:, :5], mask[1:, :5])
    padded, _ = ours(model, ids, mask)
    assert (padded[1, :5] - alone[0]).abs().max() < TOLERANCE


def test_last_token_pooling_reads_the_last_real_token_on_either_side(checkpoint):
    folder, hf = checkpoint
    model = load_pretrained(folder, pooling="lasttoken").model
    for side in ("right", "left"):
        ids, mask = batch(LENGTHS["long"], side)
        with torch.no_grad():
            got, _ = model(ids, mask)
        hidden, _ = theirs(hf, ids, mask, **NO_CACHE)
        last = [int(torch.nonzero(m).max()) for m in mask]
        want = hidden[torch.arange(len(last)), last]
        assert (got - want).abs().max() < TOLERANCE


@pytest.mark.parametrize("labels", [1, 3])
def test_sequence_classifier_logits_match_transformers(tmp_path, labels):
    hf = save(tmp_path, "Qwen3ForSequenceClassification", num_labels=labels)
    loaded = load_pretrained(tmp_path)
    assert loaded.task == ("rerank" if labels == 1 else "classify")
    for side in ("right", "left"):
        ids, mask = batch(LENGTHS["long"], side)
        with torch.no_grad():
            got, _ = loaded.model(ids, mask)
            want = hf(input_ids=ids, attention_mask=mask, **NO_CACHE).logits
        assert got.shape == (3, labels) and (got - want).abs().max() < TOLERANCE


def card_p_yes(hf, ids: torch.Tensor) -> float:
    """Qwen3-Reranker's model card, on one unpadded sequence: softmax over the last position's
    logits of "no" and "yes", taken at "yes"."""
    with torch.no_grad():
        logits = hf(input_ids=ids[None], **NO_CACHE).logits[0, -1]
    pair = torch.log_softmax(torch.stack([logits[NO], logits[YES]]), dim=0)
    return pair[1].exp().item()


@pytest.mark.parametrize("tied", [False, True])
def test_a_causal_lm_reranks_with_the_cards_p_yes(tmp_path, tied):
    hf = save(tmp_path, "Qwen3ForCausalLM", tie_word_embeddings=tied)
    assert ("lm_head.weight" in read_state_dict(tmp_path)) is not tied
    loaded = load_pretrained(tmp_path, task="rerank")
    assert (loaded.task, loaded.labels, loaded.judge_ids) == ("rerank", ["yes"], (YES, NO))
    ids, mask = batch([14, 9, 3], "right", seed=4)
    with torch.no_grad():
        logits, _ = loaded.model(ids, mask)
    for row, n in enumerate(mask.sum(1).tolist()):
        p_yes = torch.sigmoid(logits[row, 0]).item()
        assert p_yes == pytest.approx(card_p_yes(hf, ids[row, :n]), abs=TOLERANCE)


def test_a_causal_lm_without_yes_and_no_tokens_is_refused_naming_them(tmp_path):
    save(tmp_path, "Qwen3ForCausalLM", yes_no=False)
    with pytest.raises(ValueError, match="no 'yes' nor 'no' token"):
        load_pretrained(tmp_path, task="rerank")
    with pytest.raises(ValueError, match="no 'oui' token"):
        load_pretrained(tmp_path, task="rerank", judge=("oui", "w8"))


def test_a_causal_lm_without_its_head_or_a_tie_is_refused(tmp_path):
    save(tmp_path, "Qwen3ForCausalLM", tie_word_embeddings=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(WeightLoadError, match="lm_head.weight"):
        load_pretrained(tmp_path, task="rerank")


def test_a_plain_causal_lm_is_an_embedder_unless_asked_to_rerank(tmp_path):
    save(tmp_path, "Qwen3ForCausalLM")
    assert load_pretrained(tmp_path).task == "embed"


def test_sliding_window_layers_are_refused_by_name(tmp_path):
    save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    with pytest.raises(ValueError, match="sliding-window"):
        load_pretrained(tmp_path)


# --- checkpoints as the Hub stores large ones ------------------------------------------------


def shard(folder, fmt: str) -> None:
    """The folder's model.safetensors split into three shards with an index, as
    save_pretrained(max_shard_size=...) writes them, in safetensors or torch's format."""
    state = read_state_dict(folder)
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    weight_map = {}
    for i in range(3):
        part = {k: state[k].contiguous() for k in names[i::3]}
        file = f"model-{i + 1:05d}-of-00003.{fmt}"
        if fmt == "safetensors":
            save_file(part, str(folder / file))
        else:
            torch.save(part, folder / file)
        weight_map |= dict.fromkeys(part, file)
    index = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    (folder / f"{index}.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_sharded_checkpoints_load_through_their_index(tmp_path, fmt):
    hf = save(tmp_path)
    shard(tmp_path, fmt)
    ids, mask = batch(LENGTHS["short"])
    diffs(*ours(load_pretrained(tmp_path).model, ids, mask), *theirs(hf, ids, mask), mask).check()


def test_a_missing_shard_is_named(tmp_path):
    save(tmp_path)
    shard(tmp_path, "safetensors")
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_become_float32(tmp_path, dtype):
    hf = save(tmp_path)
    state = {k: v.to(dtype) for k, v in read_state_dict(tmp_path).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    with torch.no_grad():  # transformers on the same rounded weights (not its rotary buffers:
        for p in hf.parameters():  # `hf.to(dtype)` would round the inverse frequencies too)
            p.copy_(p.to(dtype).float())
    model = load_pretrained(tmp_path).model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids, mask = batch(LENGTHS["short"])
    diffs(*ours(model, ids, mask), *theirs(hf, ids, mask), mask).check()
