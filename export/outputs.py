"""A model's outputs besides the pooled vector, for the bundle: what the manifest says of them
(their ids from the model's tokenizer) and their parity, ONNX Runtime against PyTorch.

Parity is over what the service reads: the real tokens' weights and vectors (padding's are
computed, and never answered), and the SPLADE vector whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tokenizers import Tokenizer

from export import verify
from models.outputs import TOKEN_VECTORS, TOKEN_WEIGHTS, VOCABULARY, MultiOutputEncoder
from models.weights import LoadedModel
from service.manifest import MultiVectorOutput, Parity, SparseOutput
from service.tensors import cosines

OUTPUTS_MAX_ABS = 1e-4  # fp32, relative to max(1, |value|)
FP16_MIN_COSINE = verify.FP16_MIN_COSINE


def _special_map(folder: Path) -> dict[str, str]:
    """The Hugging Face tokenizer's named special tokens (cls_token, eos_token, ...)."""
    out: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not path.exists():
            continue
        for key, value in json.loads(path.read_text()).items():
            if key.endswith("_token") and isinstance(value, str | dict):
                content = value.get("content") if isinstance(value, dict) else value
                if isinstance(content, str):
                    out[key] = content
    return out


def unk_id(tok: Tokenizer) -> int | None:
    model = json.loads(tok.to_str()).get("model", {})
    if isinstance(model.get("unk_id"), int):
        return int(model["unk_id"])
    token = model.get("unk_token")
    return tok.token_to_id(token) if isinstance(token, str) else None


def _id(tok: Tokenizer, token: str, what: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise ValueError(f"{what} {token!r} is not in the model's vocabulary (tokenizer.json)")
    return found


def dropped_ids(loaded: LoadedModel, tok: Tokenizer, cls: int | None, sep: int | None) -> list[int]:
    """FlagEmbedding's unused tokens: the cls, eos, pad and unk tokens its tokenizer names
    (else the template's first and last special tokens, the pad id and the model's unk)."""
    named = _special_map(loaded.tokenizer_path.parent)
    ids = {named_id for key in ("cls_token", "eos_token", "pad_token", "unk_token")
           if key in named and (named_id := tok.token_to_id(named[key])) is not None}  # fmt: skip
    if not named:
        ids = {i for i in (cls, sep, loaded.config.pad_token_id, unk_id(tok)) if i is not None}
    return sorted(ids)


def _mask_id(loaded: LoadedModel, tok: Tokenizer) -> int:
    named = _special_map(loaded.tokenizer_path.parent).get("mask_token")
    for token in (named, "[MASK]", "<mask>"):
        if token and (found := tok.token_to_id(token)) is not None:
            return found
    raise ValueError("query expansion pads queries with the mask token; the vocabulary has none")


def manifest_fields(
    loaded: LoadedModel, tok: Tokenizer, cls: int | None, sep: int | None
) -> dict[str, Any]:
    """The manifest's outputs, sparse and multi_vector fields for this model."""
    model = loaded.model
    if not isinstance(model, MultiOutputEncoder):
        return {"outputs": ["dense"] if loaded.task == "embed" else []}
    spec = model.spec
    fields: dict[str, Any] = {"outputs": spec.names}
    if spec.sparse == "token_weights":
        fields["sparse"] = SparseOutput(
            kind="token_weights",
            graph_output=TOKEN_WEIGHTS,
            dropped_ids=dropped_ids(loaded, tok, cls, sep),
        )
    elif spec.sparse == "vocabulary":
        fields["sparse"] = SparseOutput(
            kind="vocabulary",
            graph_output=VOCABULARY,
            pooling=spec.splade_pooling,
            activation=spec.splade_activation,
        )
    if spec.vectors_dim:
        c = spec.colbert
        if c is None:
            fields["multi_vector"] = MultiVectorOutput(
                graph_output=TOKEN_VECTORS, dim=spec.vectors_dim, skip_first=spec.skip_first
            )
        else:
            unk = unk_id(tok)
            skip = {tok.token_to_id(w) for w in c.skiplist_words}
            skip = {unk if i is None else i for i in skip} - {None}
            fields["multi_vector"] = MultiVectorOutput(
                graph_output=TOKEN_VECTORS,
                dim=spec.vectors_dim,
                skip_ids=sorted(i for i in skip if i is not None),
                query_marker=_id(tok, c.query_prefix, "query_prefix") if c.query_prefix else None,
                document_marker=(
                    _id(tok, c.document_prefix, "document_prefix") if c.document_prefix else None
                ),
                query_length=c.query_length,
                document_length=c.document_length,
                query_expansion=c.do_query_expansion,
                attend_to_expansion=c.attend_to_expansion_tokens,
                expansion_id=_mask_id(loaded, tok) if c.do_query_expansion else None,
            )
    return fields


def _real(name: str, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """What the service reads of an output: its real tokens' rows, or the whole text's."""
    if name == TOKEN_VECTORS:
        return cast(np.ndarray, values[mask.astype(bool)])  # (T, d')
    if name == TOKEN_WEIGHTS:
        return cast(np.ndarray, values * mask)  # (B, N), padding zeroed
    return values  # (B, V)


def parity(name: str, got: np.ndarray, want: np.ndarray, reference: str) -> Parity:
    """Max abs difference, and cosines over the rows that are not all zero (a text's SPLADE
    vector or weights may be; a cosine of zeros says nothing)."""
    live = np.abs(want).sum(-1) > 0
    cos = cosines(got[live], want[live]) if live.any() else np.ones(1)
    return Parity(
        reference=reference,
        texts=len(got),
        max_abs_diff=float(np.abs(got - want).max()) if got.size else 0.0,
        min_cosine=float(cos.min()),
        mean_cosine=float(cos.mean()),
    )


def torch_outputs(model: MultiOutputEncoder, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model.outputs(
            torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
        )
    return {k: v.numpy() for k, v in out.items()}


def check(
    model: MultiOutputEncoder,
    graph: Path,
    feeds: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    reference: str = "pytorch",
    min_cosine: float | None = None,
) -> dict[str, Parity]:
    """Each output but the primary and the token states, against `want`; raises when off:
    fp32 by absolute difference, a lower precision (min_cosine) by cosine."""
    session = verify.checking_session(graph)
    names = [n for n in model.spec.graph_outputs[1:] if n in (TOKEN_WEIGHTS, VOCABULARY, TOKEN_VECTORS)]
    if model.spec.graph_outputs[0] != "sentence_embedding":
        names.insert(0, model.spec.graph_outputs[0])
    got = dict(zip(names, session.run(names, feeds), strict=True))
    mask = feeds["attention_mask"]
    found: dict[str, Parity] = {}
    for name in names:
        a, b = _real(name, got[name], mask), _real(name, want[name], mask)
        p = parity(name, a, b, reference)
        found[name] = p
        if min_cosine is not None:
            if not p.min_cosine >= min_cosine:
                raise verify.ParityError(
                    f"{graph.name}: {name} min cosine {p.min_cosine:.6f} vs {reference} is below "
                    f"{min_cosine}; refusing to write the bundle"
                )
            continue
        limit = OUTPUTS_MAX_ABS * max(1.0, float(np.abs(b).max()) if b.size else 1.0)
        if not p.max_abs_diff <= limit:
            raise verify.ParityError(
                f"{graph.name}: {name} differs from {reference} by {p.max_abs_diff:.3g} "
                f"(limit {limit:.3g}); refusing to write the bundle"
            )
    return found
