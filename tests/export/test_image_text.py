"""Exporting image-text models (CLIP, SigLIP): both towers' graphs fused and checked, the
manifest's vision tower, zero-shot figures and text padding, SigLIP's converted tokenizer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from export.bundle import ExportOptions
from export.cli import main
from export.image_text import build_image_text
from export.spiece import CORNERS
from models.image_text import load_image_text
from service.bundle import MANIFEST, read_manifest
from tests.models.image_checkpoints import IMAGE, save_clip, save_siglip

KINDS = {"clip": save_clip, "siglip": save_siglip}


@pytest.fixture(scope="module", params=sorted(KINDS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp(request.param)
    theirs = KINDS[request.param](folder / "model")
    out = folder / "bundle"
    assert main(["--model", str(folder / "model"), "--out", str(out), "--fp16"]) == 0
    return request.param, theirs, folder / "model", out


def test_manifest_describes_both_towers(exported) -> None:
    kind, theirs, _, out = exported
    m = read_manifest(out / MANIFEST)
    assert m.architecture == kind and m.task == "embed" and m.normalize is False
    assert m.dimensions == (24 if kind == "clip" else 48)
    assert m.text_padding == ("longest" if kind == "clip" else "max_length")
    v = m.vision
    assert v is not None and v.architecture == kind
    assert (v.image_size, v.patch_size, v.tokens) == (IMAGE, 8, 16 + (kind == "clip"))
    assert v.pooling == ("cls" if kind == "clip" else "map")
    assert set(v.graphs) == {"encoder", "attention", "encoder_fp16"}
    assert v.graphs["encoder"].fused and v.graphs["encoder"].op_counts.get("Softmax", 0) == 0
    # One fused attention per layer (SigLIP's pooling head one more), none left as Softmax.
    assert v.graphs["encoder"].op_counts["MultiHeadAttention"] == 2 + (kind == "siglip")
    assert v.graphs["attention"].gated_parity is not None
    assert v.graphs["attention"].parity.attention_max_abs_diff <= 1e-4
    for graph in v.graphs.values():
        assert (out / graph.file).exists() and graph.file in m.files()
    z = m.zero_shot
    assert z is not None
    assert z.scale == pytest.approx(math.exp(theirs.logit_scale.item()), rel=1e-6)
    assert z.probabilities == ("softmax" if kind == "clip" else "sigmoid")
    assert z.bias == pytest.approx(theirs.logit_bias.item() if kind == "siglip" else 0.0)
    assert v.preprocessing.output_size == (IMAGE, IMAGE)


def test_vision_graph_equals_transformers(exported) -> None:
    """The bundle's own graphs against transformers' get_image_features on the same pixels."""
    import torch

    _, theirs, _, out = exported
    pixels = np.random.default_rng(1).normal(size=(3, 3, IMAGE, IMAGE)).astype(np.float32)
    with torch.no_grad():
        want = theirs.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()
    for name in ("encoder.vision.onnx", "attention.vision.onnx"):
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        got = session.run(None, {"pixel_values": pixels})[0]
        assert np.abs(got - want).max() < 1e-4


def test_tokenizer_is_the_checkpoints(exported) -> None:
    """CLIP's tokenizer.json as shipped; SigLIP's spiece.model converted, encoding as
    SiglipTokenizer does (cut at the max length, as the bundle's is)."""
    kind, _, model, out = exported
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    texts = [*CORNERS, "Two DOGS, playing in the snow!!", "a  red\tcar near the old church"]
    if kind == "clip":
        shipped = Tokenizer.from_file(str(model / "tokenizer.json"))
        assert all(tok.encode(t).ids == shipped.encode(t).ids[:16] for t in ["w5 w9 w3", "w1"])
        return
    from transformers import SiglipTokenizer

    slow = SiglipTokenizer.from_pretrained(str(model))
    for text in texts:
        assert tok.encode(text).ids == slow(text, truncation=True, max_length=16).input_ids


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_int8_towers_are_gated_on_retrieval(tmp_path: Path, kind: str) -> None:
    """--int8 quantises both towers: the text's gated as every text model's (retrieval of
    docstring pairs), the vision tower's on image -> caption retrieval of captioned shapes, the
    captions embedded by the fp32 text tower; the manifest says what each gate measured."""
    KINDS[kind](tmp_path / "model")
    # A random model cannot show retrieval quality: a few pairs exercise the gates, fast.
    options = ExportOptions(int8=True, int8_pairs=24)
    m = build_image_text(load_image_text(tmp_path / "model"), tmp_path / "b", options)
    assert m.graphs["encoder_int8"].quality is not None
    v = m.vision
    assert v is not None and "encoder_int8" in v.graphs
    q = v.graphs["encoder_int8"].quality
    assert q is not None and q.pairs == 24 and "captioned shapes" in q.corpus
    assert q.max_drop <= q.max_drop_allowed
    assert v.graphs["encoder_int8"].parity.min_cosine >= 0.9
    assert (v.graphs["encoder_int8"].quantised or 0) + len(v.graphs["encoder_int8"].kept_fp32) > 0
    assert (tmp_path / "b" / "encoder.vision.int8.onnx").exists()


def test_a_preprocessor_of_another_size_is_refused(tmp_path: Path) -> None:
    import json

    save_clip(tmp_path / "model")
    path = tmp_path / "model" / "preprocessor_config.json"
    cfg = json.loads(path.read_text())
    cfg["crop_size"] = {"height": 48, "width": 48}
    path.write_text(json.dumps(cfg))
    assert main(["--model", str(tmp_path / "model"), "--out", str(tmp_path / "b")]) == 1
    assert not (tmp_path / "b").exists()


def test_the_int8_towers_serve_with_precision_int8(tmp_path: Path) -> None:
    from tests.service.api.test_images import PICTURES, data_uri, encoded
    from tests.service.conftest import client_for

    save_clip(tmp_path / "model")
    options = ExportOptions(int8=True, int8_pairs=24)
    build_image_text(load_image_text(tmp_path / "model"), tmp_path / "b", options)
    image = data_uri(encoded(PICTURES[0]))
    vectors = {}
    for precision in ("fp32", "int8"):
        with client_for(tmp_path / "b", precision=precision) as c:
            info = c.get("/info").json()["models"][0]
            assert info["precision"] == precision and info["vision"]["precision"] == precision
            r = c.post("/encode", json={"inputs": ["w5 w7"], "images": [image], "normalize": True})
            assert r.status_code == 200, r.text
            vectors[precision] = np.asarray(r.json()["embeddings"])
    cos = (vectors["fp32"] * vectors["int8"]).sum(1)
    assert cos.min() > 0.9 and not np.allclose(vectors["fp32"], vectors["int8"])
