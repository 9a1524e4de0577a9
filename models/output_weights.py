"""Which outputs a checkpoint folder has besides a pooled vector, detected from its files, and
their heads' weights (models/outputs.py):

- bge-m3 (FlagEmbedding's layout): sparse_linear.pt and colbert_linear.pt beside the model
  (torch state dicts of two nn.Linear, read with weights_only=True), or their .safetensors form.
  FlagEmbedding loads them only together, so one without the other is refused. Its dense vector
  is the first token's, normalised: FlagEmbedding's M3 default when the folder has no
  sentence-transformers pipeline (modules.json) to say otherwise.
- SPLADE: a `*ForMaskedLM` checkpoint whose sentence-transformers pipeline is MLMTransformer ->
  SpladePooling, or any masked-LM checkpoint exported with `--task sparse` (SPLADE-max, relu):
  the family's masked-LM head, its decoder tied to the token embeddings when not stored.
- ColBERT (PyLate's layout): a Dense module on every token (modules.json, no Pooling before
  it) and PyLate's query/document settings in config_sentence_transformers.json.
"""

from __future__ import annotations

import json
import logging
import string
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from models.encoder import SentenceEncoder
from models.families import family_of
from models.outputs import ColbertInputs, MultiOutputEncoder, OutputSpec
from models.pooling import Pooling
from models.st_modules import ColbertModule, read_config
from models.weights import LoadedModel, WeightLoadError, read_state_dict

log = logging.getLogger(__name__)

M3_HEADS = ("sparse_linear", "colbert_linear")
PYLATE_DEFAULTS = ColbertInputs(skiplist_words=tuple(string.punctuation))


def head_file(folder: Path, name: str) -> Path | None:
    """FlagEmbedding's `name`.pt, or its safetensors form."""
    for suffix in (".safetensors", ".pt"):
        if (folder / f"{name}{suffix}").exists():
            return folder / f"{name}{suffix}"
    return None


def read_head(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state: dict[str, Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def _linear(state: dict[str, Tensor], where: str, d_in: int, prefix: str = "") -> dict[str, Tensor]:
    """An nn.Linear's weight (and bias) from a state dict, checked against the model's width."""
    weight = state.get(f"{prefix}weight")
    if weight is None or weight.ndim != 2 or weight.shape[1] != d_in:
        shape = None if weight is None else tuple(weight.shape)
        raise WeightLoadError(f"{where}: expected {prefix}weight of shape (out, {d_in}), got {shape}")
    out = {"weight": weight}
    if f"{prefix}bias" in state:
        out["bias"] = state[f"{prefix}bias"]
    return out


def colbert_inputs(module: ColbertModule) -> ColbertInputs:
    """PyLate's settings, each defaulting as PyLate does when the config leaves it out."""
    given: dict[str, Any] = dict(module.settings)
    if "skiplist_words" in given:
        given["skiplist_words"] = tuple(given["skiplist_words"] or ())
    values = {k: v for k, v in given.items() if v is not None}
    inputs = replace(PYLATE_DEFAULTS, **values)
    if not inputs.do_query_expansion:  # PyLate: no expansion tokens to attend to
        inputs = replace(inputs, attend_to_expansion_tokens=False)
    for name in ("query_length", "document_length"):
        if getattr(inputs, name) < 3:
            raise ValueError(f"PyLate's {name} {getattr(inputs, name)} leaves no room for a text")
    return inputs


def _spec(folder: Path, hf: dict[str, Any], sparse: bool) -> tuple[OutputSpec, dict[str, Any]] | None:
    """The folder's outputs and what their heads need; None: a plain (dense) encoder."""
    st = read_config(folder)
    m3 = {name: head_file(folder, name) for name in M3_HEADS}
    found = [name for name, path in m3.items() if path is not None]
    present = (("bge-m3", found), ("SPLADE", sparse or st.splade), ("ColBERT", st.colbert))
    kinds = [kind for kind, on in present if on]
    if len(kinds) > 1:
        raise ValueError(f"{folder}: found the heads of {' and '.join(kinds)}; a model has one kind")
    if found and len(found) < len(M3_HEADS):
        missing = next(n for n in M3_HEADS if n not in found)
        raise ValueError(
            f"{folder} has {found[0]} but no {missing}.pt: FlagEmbedding loads the two together"
        )
    if found:
        colbert_path = m3["colbert_linear"]
        assert colbert_path is not None
        heads = {name: read_head(path) for name, path in m3.items() if path is not None}
        colbert = heads["colbert_linear"]
        if "weight" not in colbert or colbert["weight"].ndim != 2:
            raise WeightLoadError(f"{colbert_path}: expected an nn.Linear state dict (weight, bias)")
        spec = OutputSpec(
            dense=True,
            sparse="token_weights",
            vectors_dim=colbert["weight"].shape[0],
            vectors_bias="bias" in colbert,
            skip_first=True,
        )
        return spec, {"m3": heads}
    if sparse or st.splade:
        if not any(a.endswith("ForMaskedLM") for a in hf.get("architectures") or []):
            log.warning("%s: not a *ForMaskedLM checkpoint; looking for its MLM head anyway", folder)
        splade = st.splade
        spec = OutputSpec(
            dense=False,
            sparse="vocabulary",
            splade_pooling=splade.pooling if splade else "max",  # type: ignore[arg-type]
            splade_activation=splade.activation if splade else "relu",  # type: ignore[arg-type]
        )
        return spec, {}
    if st.colbert is not None:
        dense = st.colbert.dense
        spec = OutputSpec(
            dense=False,
            vectors_dim=dense.out_features,
            vectors_bias=dense.bias,
            colbert=colbert_inputs(st.colbert),
        )
        return spec, {"colbert": st.colbert}
    return None


def _m3_heads(model: MultiOutputEncoder, heads: dict[str, dict[str, Tensor]]) -> None:
    """sparse_linear: Linear(d, 1); colbert_linear: Linear(d, d')."""
    d = model.cfg.d_model
    sparse = _linear(heads["sparse_linear"], "sparse_linear", d)
    if sparse["weight"].shape[0] != 1 or "bias" not in sparse:
        raise WeightLoadError(f"sparse_linear: expected a Linear({d}, 1) with a bias")
    colbert = _linear(heads["colbert_linear"], "colbert_linear", d)
    assert model.token_weights is not None and model.token_vectors is not None
    model.token_weights.linear.load_state_dict({k: v.float() for k, v in sparse.items()})
    model.token_vectors.linear.load_state_dict({k: v.float() for k, v in colbert.items()})


def _mlm_head(model: MultiOutputEncoder, folder: Path, hf: dict[str, Any]) -> None:
    """The family's masked-LM head from the checkpoint; a tied decoder takes the embeddings."""
    family = family_of(hf)
    names = family.mlm_head
    if not names:
        raise ValueError(
            f"{family.architecture}: no masked-LM head layout (SPLADE needs one); supported are "
            "BERT, RoBERTa, XLM-RoBERTa and DistilBERT masked-LM checkpoints"
        )
    state = {
        k.removesuffix(".gamma") + ".weight" if k.endswith(".gamma") else
        k.removesuffix(".beta") + ".bias" if k.endswith(".beta") else k: v
        for k, v in read_state_dict(folder).items()
    }  # fmt: skip
    ours: dict[str, Tensor] = {}
    missing: list[str] = []
    for part in ("dense", "norm"):
        for kind in ("weight", "bias"):
            key = f"{names[part]}.{kind}"
            if key in state:
                ours[f"{part}.{kind}"] = state[key]
            else:
                missing.append(key)
    decoder = state.get(f"{names['decoder']}.weight")
    tied = decoder is None and hf.get("tie_word_embeddings", True)
    if decoder is None and not tied:
        missing.append(f"{names['decoder']}.weight")
    # BERT and RoBERTa keep the vocabulary bias as a tensor of its own (tied to the decoder's).
    bias = state.get(names.get("bias", ""), state.get(f"{names['decoder']}.bias"))
    if bias is None:
        missing.append(names.get("bias", f"{names['decoder']}.bias"))
    if missing:
        raise WeightLoadError(
            f"{folder}: the masked-LM head (SPLADE) is incomplete: missing {', '.join(missing)}"
        )
    assert model.mlm is not None and bias is not None  # bias: else missing, refused above
    embeddings = model.encoder.embeddings.tokens.weight
    ours["decoder.weight"] = embeddings.detach() if decoder is None else decoder
    ours["decoder.bias"] = bias
    want = model.mlm.state_dict()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(want[k].shape)}" for k, v in ours.items() if v.shape != want[k].shape]
    if bad:
        raise WeightLoadError(f"{folder}: mis-shaped masked-LM head tensors: {'; '.join(bad)}")
    model.mlm.load_state_dict({k: v.float() for k, v in ours.items()})
    if decoder is None:
        model.mlm.decoder.weight = embeddings  # tied, as the checkpoint is: one copy


def with_outputs(
    loaded: LoadedModel, sparse: bool = False, pooling: str | None = None
) -> LoadedModel:
    """The loaded encoder with the outputs its folder has (or `sparse`: SPLADE from its MLM
    head); unchanged when it has none besides the pooled vector."""
    folder = loaded.source
    hf = json.loads((folder / "config.json").read_text())
    found = _spec(folder, hf, sparse)
    if found is None:
        return loaded
    spec, parts = found
    if loaded.task != "embed":
        raise ValueError(f"{', '.join(spec.names)} outputs need task embed, not {loaded.task!r}")
    base = cast(SentenceEncoder, loaded.model)  # task embed: load_pretrained's SentenceEncoder
    config, normalize = loaded.config, loaded.normalize
    if "m3" in parts and pooling is None and not (folder / "modules.json").exists():
        # No sentence-transformers pipeline to follow: FlagEmbedding's M3, the first token's
        # vector, normalised.
        config, normalize = config.replace(pooling="cls"), True
    model = MultiOutputEncoder(config, spec)
    model.encoder = base.encoder
    if model.pool is not None:
        model.pool = Pooling(config.pooling, config.dense_layers)
        model.pool.load_state_dict(base.pool.state_dict())
    if "m3" in parts:
        _m3_heads(model, parts["m3"])
    elif spec.sparse == "vocabulary":
        _mlm_head(model, folder, hf)
    else:
        module: ColbertModule = parts["colbert"]
        if module.dense.in_features != config.d_model:
            raise ValueError(f"{module.dense.folder}: in_features is not the model's {config.d_model}")
        state = read_state_dict(module.dense.folder)
        linear = _linear(state, str(module.dense.folder), config.d_model, "linear.")
        assert model.token_vectors is not None
        model.token_vectors.linear.load_state_dict({k: v.float() for k, v in linear.items()})
    model.eval()
    max_length = loaded.max_length
    if spec.colbert is not None:
        max_length = min(max_length, spec.colbert.document_length)
    log.info("%s: outputs %s", folder, ", ".join(model.spec.names))
    return replace(
        loaded, model=model, config=config, normalize=normalize, max_length=max_length
    )
