"""TEI's `Info` fields, for one served model: what a TEI client reads from `GET /info`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from service import __version__
from service.engine.preparing import workers
from service.registry import Model
from service.settings import Settings

PRECISION_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}


def model_type(model: Model) -> dict[str, Any]:
    m = model.backend.manifest
    labels = {
        "id2label": {str(i): label for i, label in enumerate(m.labels)},
        "label2id": {label: i for i, label in enumerate(m.labels)},
    }
    # A SPLADE model (its only output a vocabulary vector) is what TEI calls splade pooling.
    splade = m.outputs == ["sparse"] and m.sparse is not None and m.sparse.kind == "vocabulary"
    kinds: dict[str, dict[str, Any]] = {
        "embed": {"embedding": {"pooling": "splade" if splade else m.pooling}},
        "rerank": {"reranker": labels},
        "classify": {"classifier": labels},
    }
    return kinds[m.task]


def tei_info(model: Model, s: Settings) -> dict[str, Any]:
    m = model.backend.manifest
    return {
        "model_id": m.source.id if m.source.kind == "hub" else model.name,
        "model_sha": m.source.revision,
        "model_dtype": PRECISION_DTYPES[model.backend.info.precision],
        "served_model_name": model.name,
        "model_type": model_type(model),
        "max_concurrent_requests": s.max_concurrency,
        "max_input_length": m.max_length,
        "max_batch_tokens": s.max_batch_tokens,
        "max_batch_requests": s.max_batch_size,
        "max_client_batch_size": s.max_inputs,
        "auto_truncate": True,
        "tokenization_workers": workers(),
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }


class Info(BaseModel):
    """TEI's Info (the fields TEI's clients read)."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str
    served_model_name: str | None = None
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None = None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None
