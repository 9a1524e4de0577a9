"""A half-precision checkpoint loaded with keep_half holds its weights as stored, and computes
inside float32_compute exactly what the float32 model does: every output and attention map
equal, bit for bit (float32 holds every bfloat16 and float16 value)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from models.precision import HALF, float32_compute, half_tensors
from models.weights import load_pretrained, read_state_dict
from tests.models import test_deberta, test_qwen3
from tests.models.checkpoints import batch, save_checkpoint


def halve(folder, dtype: torch.dtype) -> None:
    state = {k: v.to(dtype) for k, v in read_state_dict(folder).items()}
    save_file(state, str(folder / "model.safetensors"))


def qwen3_reranker(folder):
    test_qwen3.save(folder, "Qwen3ForCausalLM")
    return {"task": "rerank"}


def qwen3_embedder(folder):
    test_qwen3.save(folder)
    return {}


def deberta_classifier(folder):
    config = test_deberta.CONFIG
    save_checkpoint(
        folder, "DebertaV2ForSequenceClassification", "DebertaV2Config", num_labels=3, **config
    )
    return {}


MODELS = {
    "qwen3-embedder": qwen3_embedder,
    "qwen3-reranker": qwen3_reranker,
    "deberta-classifier": deberta_classifier,
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", MODELS)
def test_half_weights_stay_half_and_compute_what_float32_weights_do(tmp_path, name, dtype):
    kwargs = MODELS[name](tmp_path)
    halve(tmp_path, dtype)
    wide = load_pretrained(tmp_path, **kwargs).model
    narrow = load_pretrained(tmp_path, keep_half=True, **kwargs).model
    assert not half_tensors(wide)
    held = half_tensors(narrow)
    assert held and all(t.dtype == dtype for t in held)
    ids, mask = batch([6, 4, 1])
    with torch.no_grad():
        want, want_maps = wide(ids, mask, need_weights=True)
        with float32_compute(narrow):
            got, got_maps = narrow(ids, mask, need_weights=True)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert all(torch.equal(g, w) for g, w in zip(got_maps, want_maps, strict=True))
    assert [t.dtype for t in half_tensors(narrow)] == [dtype] * len(held)  # nothing converted


def test_a_float32_model_is_left_alone(tmp_path):
    qwen3_embedder(tmp_path)
    model = load_pretrained(tmp_path, keep_half=True).model
    assert not half_tensors(model)
    ids, mask = batch([5, 3])
    with torch.no_grad():
        want, _ = model(ids, mask)
        with float32_compute(model):
            got, _ = model(ids, mask)
    assert torch.equal(got, want)
