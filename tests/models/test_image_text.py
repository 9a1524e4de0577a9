"""CLIP and SigLIP from scratch against transformers' CLIPModel and SiglipModel: image and text
features, every layer's attention maps (and SigLIP's pooling probe), zero-shot probabilities,
and head gates, on random-weight checkpoints (tests/models/image_checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models.image_text import LoadedImageText, load_image_text
from models.vision import VisionConfig
from tests.models.checkpoints import TOLERANCE
from tests.models.image_checkpoints import EOS, pixels, save_clip, save_siglip, texts

KINDS = {"clip": save_clip, "siglip": save_siglip}


@pytest.fixture(scope="module", params=sorted(KINDS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp(request.param)
    theirs = KINDS[request.param](folder)
    return request.param, theirs, load_image_text(folder)


def _features(out: object) -> torch.Tensor:
    """get_*_features: a tensor in transformers 4, an output with pooler_output in 5."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output  # type: ignore[attr-defined]


def test_text_features(pair: tuple[str, torch.nn.Module, LoadedImageText]) -> None:
    kind, theirs, loaded = pair
    if kind == "clip":
        ids, mask = texts([5, 9, 3])
        feed = {"input_ids": ids, "attention_mask": mask}
    else:  # SigLIP: padded to the full length, no mask (its model card)
        ids, mask = texts([16, 16], pad=1)
        feed = {"input_ids": ids}
    with torch.no_grad():
        want = _features(theirs.get_text_features(**feed))
        got, _ = loaded.model.text(ids, feed.get("attention_mask", torch.ones_like(ids)))
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < TOLERANCE


def test_clip_pools_the_first_end_token(tmp_path: Path) -> None:
    """Padded with the end token itself (as openai/clip pads), the first one is pooled."""
    theirs = save_clip(tmp_path)
    loaded = load_image_text(tmp_path)
    ids, mask = texts([4, 9], pad=EOS)
    with torch.no_grad():
        want = _features(theirs.get_text_features(input_ids=ids, attention_mask=mask))
        got, _ = loaded.model.text(ids, mask)
    assert (got - want).abs().max().item() < TOLERANCE


def test_image_features_and_maps(pair: tuple[str, torch.nn.Module, LoadedImageText]) -> None:
    kind, theirs, loaded = pair
    px = pixels(3)
    with torch.no_grad():
        want = _features(theirs.get_image_features(pixel_values=px))
        out = theirs.vision_model(pixel_values=px, output_attentions=True)
        got = loaded.model.vision.run(px, need_weights=True)
    assert (got.pooled - want).abs().max().item() < TOLERANCE
    assert got.attentions is not None and len(got.attentions) == len(out.attentions)
    for ours, ref in zip(got.attentions, out.attentions, strict=True):
        assert ours.shape == ref.shape  # (B, h, N, N): CLIP's class token + 16 patches
        assert (ours - ref).abs().max().item() < TOLERANCE
    v: VisionConfig = loaded.config.vision
    assert got.attentions[0].shape[-1] == v.tokens == 16 + (kind == "clip")
    if kind == "siglip":  # the MAP head's probe over the patches, against torch's own MHA
        head = theirs.vision_model.head
        hidden = out.last_hidden_state  # SigLIP's is post-layernormed already
        with torch.no_grad():
            _, ref = head.attention(
                head.probe.expand(3, -1, -1), hidden, hidden, average_attn_weights=False
            )
        assert got.pool_weights is not None
        assert (got.pool_weights - ref).abs().max().item() < TOLERANCE
    else:
        assert got.pool_weights is None


def test_zero_shot_probabilities(pair: tuple[str, torch.nn.Module, LoadedImageText]) -> None:
    kind, theirs, loaded = pair
    px = pixels(2, seed=1)
    if kind == "clip":
        ids, mask = texts([4, 6, 5], seed=2)
        feed = {"input_ids": ids, "attention_mask": mask}
    else:
        ids, mask = texts([16, 16, 16], seed=2, pad=1)
        mask = torch.ones_like(ids)
        feed = {"input_ids": ids}
    with torch.no_grad():
        out = theirs(pixel_values=px, **feed)
        want = out.logits_per_image.softmax(-1) if kind == "clip" else torch.sigmoid(out.logits_per_image)
        model = loaded.model
        logits = model.logits(model.vision(px)[0], model.text(ids, mask)[0])
        got = model.probabilities(logits)
    assert (logits - out.logits_per_image).abs().max().item() < TOLERANCE * 10  # x exp(scale)
    assert (got - want).abs().max().item() < TOLERANCE
    assert loaded.config.probabilities == ("softmax" if kind == "clip" else "sigmoid")


def test_vision_head_gate_is_the_head_cut_out(pair: tuple[str, torch.nn.Module, LoadedImageText]) -> None:
    """A gate of 0 on a vision head equals transformers with that head's W_O columns zeroed."""
    kind, theirs, loaded = pair
    px = pixels(2, seed=3)
    layer, head, d_k = 1, 2, 12
    gates = torch.ones(2, 2, 4)
    gates[:, layer, head] = 0.0
    with torch.no_grad():
        got, _ = loaded.model.vision(px, head_gates=gates)
        out_proj = theirs.vision_model.encoder.layers[layer].self_attn.out_proj
        out_proj.weight[:, head * d_k : (head + 1) * d_k] = 0.0
        want = _features(theirs.get_image_features(pixel_values=px))
        full, _ = loaded.model.vision(px)
    assert (got - want).abs().max().item() < TOLERANCE
    assert F.cosine_similarity(got, full).min().item() < 1 - 1e-4  # the head mattered


def test_refuses_a_non_square_image_size(tmp_path: Path) -> None:
    import json

    save_clip(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["vision_config"]["image_size"] = [32, 48]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="only square sizes"):
        load_image_text(tmp_path)
