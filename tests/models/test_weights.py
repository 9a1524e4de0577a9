"""Loading checkpoints: name mapping, and errors that name the offending tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.weights import WeightLoadError, hf_to_ours, load_pretrained


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    return dst


def test_hf_names_map_onto_ours():
    assert (
        hf_to_ours("encoder.layer.3.attention.self.query.weight")
        == "encoder.layers.3.attn.q_proj.weight"
    )
    assert hf_to_ours("bert.encoder.layer.0.output.LayerNorm.bias") == "encoder.layers.0.norm2.bias"
    assert hf_to_ours("embeddings.LayerNorm.gamma") is not None
    assert hf_to_ours("pooler.dense.weight") is None


def test_reads_sentence_transformers_settings(default_loaded):
    assert default_loaded.config.pooling == "mean"
    assert default_loaded.max_length == 256
    assert default_loaded.normalize is True
    assert default_loaded.config.n_layers == 6 and default_loaded.config.n_heads == 12


def test_missing_unexpected_and_misshaped_tensors_are_named(model_dir, tmp_path):
    state = load_file(str(model_dir / "model.safetensors"))
    del state["encoder.layer.2.attention.self.key.bias"]
    state["encoder.layer.0.extra.weight"] = torch.zeros(2)
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(3, 3)
    folder = copy_model(model_dir, tmp_path / "broken")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(WeightLoadError) as err:
        load_pretrained(folder)
    msg = str(err.value)
    assert "encoder.layers.2.attn.k_proj.bias" in msg
    assert "encoder.layer.0.extra.weight" in msg
    assert "encoder.layers.1.ffn.fc1.weight" in msg and "(3, 3)" in msg


def test_pytorch_bin_loads_without_unpickling_code(model_dir, tmp_path, default_loaded):
    folder = copy_model(model_dir, tmp_path / "bin")
    torch.save(load_file(str(model_dir / "model.safetensors")), folder / "pytorch_model.bin")
    loaded = load_pretrained(folder)
    for k, v in default_loaded.model.state_dict().items():
        assert torch.equal(v, loaded.model.state_dict()[k]), k


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_code_in_checkpoint_is_refused(model_dir, tmp_path):
    folder = copy_model(model_dir, tmp_path / "evil")
    torch.save({"x": Evil()}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights.only|unsupported|global"):
        load_pretrained(folder)


def test_cls_pooling_and_max_length_from_files(model_dir, tmp_path):
    folder = tmp_path / "cls"
    shutil.copytree(model_dir, folder)
    pool = json.loads((folder / "1_Pooling/config.json").read_text())
    pool.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (folder / "1_Pooling/config.json").write_text(json.dumps(pool))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    loaded = load_pretrained(folder)
    assert loaded.config.pooling == "cls"
    assert loaded.max_length == 128


def test_not_a_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)
