"""--model resolves a folder or a Hugging Face Hub id; the Hub path is tested against a cache
populated here in huggingface_hub's own on-disk layout, with the Hub switched off."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from export.sources import SourceError, resolve

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "1_Pooling/config.json",
)


def populate_hub_cache(
    hf_home: Path, repo_id: str, source: Path, files=MODEL_FILES, commit=COMMIT
) -> Path:
    """HF_HOME/hub/models--org--name/{blobs, refs/main, snapshots/<commit>/…} as the Hub
    client writes it: content-addressed blobs, snapshot entries as relative symlinks."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    for name in files:
        data = (source / name).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """HF_HUB_OFFLINE=1 and an empty HF_HOME, for this process's huggingface_hub too."""
    from huggingface_hub import constants

    hf_home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the environment when imported; this process imported it already.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hf_home


def test_a_hub_id_resolves_to_its_cached_snapshot_and_records_the_commit(offline_hub, model_dir):
    snapshot = populate_hub_cache(offline_hub, "org/tiny", model_dir)
    resolved = resolve("org/tiny")
    assert resolved.folder == snapshot
    assert resolved.source.model_dump() == {"kind": "hub", "id": "org/tiny", "revision": COMMIT}
    assert resolved.name == "org/tiny"
    assert resolve("org/tiny", revision=COMMIT).folder == snapshot


def test_a_missing_repository_is_named(offline_hub):
    with pytest.raises(SourceError, match="org/absent is not in the Hugging Face cache"):
        resolve("org/absent")


def test_a_missing_revision_is_named(offline_hub, model_dir):
    populate_hub_cache(offline_hub, "org/tiny", model_dir)
    with pytest.raises(SourceError, match="revision v2 of org/tiny"):
        resolve("org/tiny", revision="v2")


def test_a_missing_file_is_named(offline_hub, model_dir):
    populate_hub_cache(
        offline_hub, "org/no-tok", model_dir, files=("config.json", "model.safetensors")
    )
    with pytest.raises(
        SourceError, match=f"org/no-tok@main \\(commit {COMMIT}\\) has no tokenizer.json"
    ):
        resolve("org/no-tok")
    populate_hub_cache(
        offline_hub, "org/no-weights", model_dir, files=("config.json", "tokenizer.json")
    )
    with pytest.raises(SourceError, match="neither model.safetensors nor pytorch_model.bin"):
        resolve("org/no-weights")


def test_a_folder_is_a_folder_source(model_dir):
    resolved = resolve(str(model_dir))
    assert resolved.folder == model_dir and resolved.source.kind == "folder"
    with pytest.raises(SourceError, match="--revision applies to Hub ids"):
        resolve(str(model_dir), revision="main")


def test_neither_a_folder_nor_a_hub_id_is_refused(tmp_path):
    with pytest.raises(SourceError, match="no such folder, and not a Hugging Face Hub id"):
        resolve(str(tmp_path / "nowhere"))


@pytest.mark.slow
def test_default_model_exports_from_its_hub_id_through_an_offline_cache(tmp_path, model_dir):
    """The real CLI in a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE."""
    from service.manifest import Manifest

    hf_home = tmp_path / "hf-home"
    populate_hub_cache(hf_home, "sentence-transformers/all-MiniLM-L6-v2", model_dir)
    out = tmp_path / "bundle"
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "export",
            "--model",
            "sentence-transformers/all-MiniLM-L6-v2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = Manifest.model_validate_json((out / "manifest.json").read_text())
    assert manifest.source.model_dump() == {
        "kind": "hub",
        "id": "sentence-transformers/all-MiniLM-L6-v2",
        "revision": COMMIT,
    }
    assert manifest.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert (manifest.pooling, manifest.normalize, manifest.max_length) == ("mean", True, 256)
    assert manifest.graphs["encoder"].op_counts["Attention"] == 6


# An EmbeddingGemma-shaped repository: its two Dense modules (config and weights) and prompts.
GEMMA_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "modules.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "2_Dense/config.json",
    "2_Dense/model.safetensors",
    "3_Dense/config.json",
    "3_Dense/model.safetensors",
)


@pytest.fixture
def gemma_dir(tmp_path) -> Path:
    from tests.export.test_new_families import FAMILIES

    FAMILIES["gemma3"].save(tmp_path / "embeddinggemma")
    return tmp_path / "embeddinggemma"


def test_a_hub_snapshot_brings_the_dense_modules_and_prompts_it_exports_with(
    offline_hub, gemma_dir, tmp_path
):
    from export.cli import main as export_cli
    from service.manifest import Manifest
    from tests.export.test_new_families import GEMMA_PROMPTS

    populate_hub_cache(offline_hub, "google/tiny-embeddinggemma", gemma_dir, files=GEMMA_FILES)
    out = tmp_path / "bundle"
    assert export_cli(["--model", "google/tiny-embeddinggemma", "--out", str(out)]) == 0
    manifest = Manifest.model_validate_json((out / "manifest.json").read_text())
    assert manifest.source.model_dump() == {
        "kind": "hub",
        "id": "google/tiny-embeddinggemma",
        "revision": COMMIT,
    }
    assert (manifest.architecture, manifest.dimensions, manifest.normalize) == ("gemma3", 32, True)
    assert manifest.prompts == GEMMA_PROMPTS
    assert manifest.graphs["encoder"].op_counts["MultiHeadAttention"] == 4


def test_a_dense_module_missing_from_the_snapshot_is_named(offline_hub, gemma_dir):
    files = [f for f in GEMMA_FILES if f != "3_Dense/model.safetensors"]
    populate_hub_cache(offline_hub, "google/no-dense", gemma_dir, files=files)
    with pytest.raises(
        SourceError,
        match="neither 3_Dense/model.safetensors nor 3_Dense/pytorch_model.bin in the cache",
    ):
        resolve("google/no-dense")
    populate_hub_cache(offline_hub, "google/no-dense-config", gemma_dir, files=GEMMA_FILES[:6])
    with pytest.raises(SourceError, match="has no 2_Dense/config.json"):
        resolve("google/no-dense-config")


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_sharded_checkpoint_resolves_with_the_shards_its_index_lists(offline_hub, tmp_path, fmt):
    from models.weights import load_pretrained
    from tests.models.test_qwen3 import save, shard

    source = tmp_path / "source"
    save(source)
    shard(source, fmt)
    index = ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin") + ".index.json"
    shards = sorted(p.name for p in source.glob(f"model-*.{fmt}"))
    populate_hub_cache(
        offline_hub, "org/sharded", source, ("config.json", "tokenizer.json", index, *shards)
    )
    resolved = resolve("org/sharded")
    assert load_pretrained(resolved.folder).config.architecture == "qwen3"
    populate_hub_cache(
        offline_hub,
        "org/half",
        source,
        ("config.json", "tokenizer.json", index, shards[0]),
        commit="f" * 40,
    )
    with pytest.raises(SourceError, match=f"lists shards .*{shards[1]}"):
        resolve("org/half")


def test_an_image_text_model_exports_from_its_hub_id_through_an_offline_cache(
    offline_hub, tmp_path
):
    """A SigLIP snapshot as the Hub serves it (config, weights, preprocessor_config.json and
    spiece.model, no tokenizer.json): fetched from the cache and exported with both towers."""
    from export.cli import main as export_cli
    from service.manifest import Manifest
    from tests.models.image_checkpoints import save_siglip

    save_siglip(tmp_path / "siglip")
    files = ("config.json", "model.safetensors", "preprocessor_config.json", "spiece.model")
    populate_hub_cache(offline_hub, "google/tiny-siglip", tmp_path / "siglip", files=files)
    out = tmp_path / "bundle"
    assert export_cli(["--model", "google/tiny-siglip", "--out", str(out)]) == 0
    manifest = Manifest.model_validate_json((out / "manifest.json").read_text())
    assert manifest.source.model_dump() == {"kind": "hub", "id": "google/tiny-siglip", "revision": COMMIT}
    assert manifest.vision is not None and manifest.vision.preprocessing.resize_height == 32
    assert manifest.text_padding == "max_length"
