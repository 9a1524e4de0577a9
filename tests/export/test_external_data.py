"""Graphs past what one protobuf holds keep their weights in one external data file beside the
graph: the same files, hashes and parity, served as any bundle. The 2 GiB limit is lowered
here so a tiny model takes that path in seconds (tests/export/test_large.py exports a real
2 GiB checkpoint, marked slow)."""

from __future__ import annotations

import numpy as np
import pytest

from export import external
from service.bundle import BundleError, load_bundle
from service.engine.sessions import build_session
from tests.export.test_architectures import export, feeds, save_checkpoint, transformers_model

TEXTS = ["the cat sat on a warm mat", "le chat dort", ""]


@pytest.fixture
def low_limit(monkeypatch):
    monkeypatch.setattr(external, "INLINE_LIMIT", 10_000)


@pytest.fixture
def bundle(family_tokenizers, tmp_path, low_limit):
    folder = save_checkpoint(tmp_path / "tiny-bert", "bert", family_tokenizers["wordpiece"])
    manifest = export(folder, tmp_path / "bundle", "--fp16")
    return folder, tmp_path / "bundle", manifest


def test_every_graph_gets_one_data_file_listed_with_its_hash_and_size(bundle):
    _, path, manifest = bundle
    for key in ("encoder", "attention", "encoder_fp16"):
        entry = manifest.graphs[key]
        (data,) = entry.data
        assert data.file == entry.file + ".data"
        assert (path / data.file).stat().st_size == data.bytes > 10_000
        assert entry.total_bytes == entry.bytes + data.bytes
    assert set(manifest.files()) | {"manifest.json"} == {p.name for p in path.iterdir()}


def test_graphs_with_external_data_equal_transformers(bundle):
    import torch

    folder, path, manifest = bundle
    x = feeds(path, manifest, TEXTS)
    got = build_session(path / "encoder.onnx").run(None, x)[0]
    hf = transformers_model(folder)
    with torch.no_grad():
        hidden = hf(**{k: torch.from_numpy(v) for k, v in x.items()}).last_hidden_state
    m = torch.from_numpy(x["attention_mask"])[:, :, None].float()
    want = ((hidden * m).sum(1) / m.sum(1)).numpy()
    assert np.abs(got - want).max() < 1e-4


def test_a_tampered_data_file_is_refused_naming_it(bundle):
    _, path, manifest = bundle
    load_bundle(path)
    data = path / manifest.graphs["encoder"].data[0].file
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="encoder.onnx.data does not match"):
        load_bundle(path)
    data.unlink()
    with pytest.raises(BundleError, match="encoder.onnx.data is missing"):
        load_bundle(path)


def test_a_graph_that_fits_stays_one_file(family_tokenizers, tmp_path):
    folder = save_checkpoint(tmp_path / "tiny-bert", "bert", family_tokenizers["wordpiece"])
    manifest = export(folder, tmp_path / "bundle")
    assert all(not g.data for g in manifest.graphs.values())
    assert not list((tmp_path / "bundle").glob("*.data"))


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_sharded_checkpoint_exports_and_serves(tmp_path, fmt):
    """transformers' save_pretrained(max_shard_size=...) shards and their index, or torch's .bin
    shards with theirs; the bundle equals sentence-transformers on the unsharded folder."""
    from tests.export.decoders import save_embedder, sentence_transformers_reference
    from tests.models.test_qwen3 import shard
    from tests.service.conftest import client_for

    hf = save_embedder(tmp_path / "model")
    want = sentence_transformers_reference(tmp_path / "model", TEXTS)
    if fmt == "safetensors":
        (tmp_path / "model" / "model.safetensors").unlink()
        hf.save_pretrained(tmp_path / "model", max_shard_size="40KB")
    else:
        shard(tmp_path / "model", "bin")
    index = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    assert (tmp_path / "model" / f"{index}.index.json").exists()
    assert len(list((tmp_path / "model").glob(f"model-0000*.{fmt}"))) > 2
    export(tmp_path / "model", tmp_path / "bundle")
    with client_for(tmp_path / "bundle") as c:
        got = c.post("/encode", json={"inputs": TEXTS}).json()["embeddings"]
    np.testing.assert_allclose(np.array(got), want, atol=1e-4)


def test_the_fp16_graph_stays_one_file_where_it_fits(family_tokenizers, tmp_path, monkeypatch):
    """A limit between the float16 and float32 weights' sizes: the float32 graphs get a data
    file, the float16 one (a 0.6B model's 1.2 GB) does not."""
    folder = save_checkpoint(tmp_path / "tiny-bert", "bert", family_tokenizers["wordpiece"])
    fp32 = (folder / "model.safetensors").stat().st_size
    monkeypatch.setattr(external, "INLINE_LIMIT", int(0.75 * fp32))
    manifest = export(folder, tmp_path / "bundle", "--fp16")
    assert manifest.graphs["encoder"].data and manifest.graphs["attention"].data
    assert not manifest.graphs["encoder_fp16"].data
    assert not (tmp_path / "bundle" / "encoder.fp16.onnx.data").exists()


def test_bge_m3s_three_outputs_survive_external_data(family_tokenizers, m3_bundle, tmp_path, low_limit):
    """bge-m3 is both: over 2 GiB and three outputs. Exported through external data, its dense,
    sparse and multi-vector answers equal those of the one-file bundle of the same checkpoint."""
    from tests.export.output_checkpoints import m3_checkpoint
    from tests.service.conftest import client_for

    folder = m3_checkpoint(tmp_path / "bge-m3-tiny", family_tokenizers["unigram"])
    manifest = export(folder, tmp_path / "bundle")
    assert manifest.graphs["encoder"].data and manifest.outputs == load_bundle(m3_bundle).manifest.outputs
    body = {"inputs": TEXTS[:2], "outputs": ["dense", "sparse", "multi_vector"]}
    answers = []
    for path in (m3_bundle, tmp_path / "bundle"):
        with client_for(path) as c:
            r = c.post("/encode", json=body)
            assert r.status_code == 200, r.text
            answers.append(r.json())
    one_file, external_data = answers
    np.testing.assert_allclose(external_data["embeddings"], one_file["embeddings"], atol=1e-5)
    for a, b in zip(external_data["sparse"], one_file["sparse"], strict=True):
        assert [w["index"] for w in a] == [w["index"] for w in b]
        np.testing.assert_allclose([w["value"] for w in a], [w["value"] for w in b], atol=1e-5)
    for a, b in zip(external_data["multi_vector"], one_file["multi_vector"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
