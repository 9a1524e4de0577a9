"""What sentence-transformers would do with a model folder: its module configs, read as data.

modules.json lists the pipeline (Transformer -> Pooling [-> Dense …] -> Normalize);
1_Pooling/config.json names the pooling mode; each Dense module's config.json its shape (a
linear map: only the identity activation is reproduced, as EmbeddingGemma's 2_Dense and
3_Dense); sentence_bert_config.json the max length; config_sentence_transformers.json the
prompts. A pipeline with a module we do not reproduce is refused by name.

Two pipelines end in something other than one pooled vector (models/outputs.py): a
SparseEncoder's MLMTransformer -> SpladePooling (its config: max or sum, relu or log1p_relu),
and PyLate's ColBERT, a Transformer -> Dense applied to every token (no Pooling before it), with
its query/document markers, lengths, query expansion and skiplist in
config_sentence_transformers.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODULES = (
    "Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling"
)
IDENTITY = "torch.nn.modules.linear.Identity"
# sentence-transformers' pooling_mode_* flags -> our pooling names.
POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
OUR_POOLING = ("mean", "cls", "lasttoken")


@dataclass(frozen=True)
class DenseModule:
    """A Dense module after pooling: y = x Wᵀ (+ b), weights in folder/model.safetensors."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool

    @property
    def shape(self) -> tuple[int, int, bool]:
        return (self.in_features, self.out_features, self.bias)


@dataclass(frozen=True)
class SentenceTransformersConfig:
    pooling: str | None = None  # None: the folder has no Pooling module
    normalize: bool = False  # the pipeline ends with Normalize
    max_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    dense: tuple[DenseModule, ...] = ()  # after pooling, in pipeline order
    splade: SpladeModule | None = None  # a SparseEncoder's SpladePooling
    colbert: ColbertModule | None = None  # PyLate: a Dense on every token, and its config


@dataclass(frozen=True)
class SpladeModule:
    """SpladePooling's config: how the MLM logits become one vocabulary-wide vector."""

    pooling: str = "max"  # or "sum"
    activation: str = "relu"  # or "log1p_relu"


@dataclass(frozen=True)
class ColbertModule:
    """PyLate's ColBERT: the token-level Dense module, and config_sentence_transformers.json's
    query/document keys (None: PyLate's default)."""

    dense: DenseModule
    settings: dict[str, object]


COLBERT_KEYS = (
    "query_prefix",
    "document_prefix",
    "query_length",
    "document_length",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "skiplist_words",
)


def _read(path: Path) -> Any:
    """A JSON file: an object (a module's config), or modules.json's list."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc


def pooling_mode(pool_cfg: Path) -> str:
    p = _read(pool_cfg)
    if isinstance(p.get("pooling_mode"), str):  # newer single-key form
        modes = [p["pooling_mode"]]
    else:
        modes = [
            POOLING_FLAGS.get(k, k) for k, v in p.items() if k.startswith("pooling_mode") and v
        ]
    if len(modes) != 1 or modes[0] not in OUR_POOLING:
        raise ValueError(f"unsupported pooling in {pool_cfg}: {modes} (supported: {OUR_POOLING})")
    if p.get("include_prompt") is False:
        raise ValueError(f"unsupported pooling in {pool_cfg}: include_prompt=false")
    mode: str = modes[0]
    return mode


def dense_module(folder: Path) -> DenseModule:
    """A Dense module's config.json, refused unless it is a plain linear map."""
    path = folder / "config.json"
    cfg = _read(path)
    # sentence-transformers' Dense defaults to Tanh when the key is absent.
    activation = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation != IDENTITY:
        raise ValueError(f"unsupported Dense activation {activation!r} in {path}: only Identity")
    if cfg.get("use_residual"):
        raise ValueError(f"unsupported Dense use_residual in {path}")
    if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"unsupported Dense on {cfg['module_input_name']!r} in {path}")
    return DenseModule(folder, cfg["in_features"], cfg["out_features"], cfg.get("bias", True))


def splade_module(folder: Path) -> SpladeModule:
    path = folder / "config.json"
    cfg = _read(path) if path.exists() else {}
    pooling = cfg.get("pooling_strategy", "max")
    activation = cfg.get("activation_function", "relu")
    if pooling not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ValueError(
            f"unsupported SpladePooling in {path}: {pooling}/{activation} "
            "(supported: max or sum, relu or log1p_relu)"
        )
    return SpladeModule(pooling, activation)


def token_dense_module(folder: Path) -> DenseModule:
    """PyLate's Dense (applied to every token): a linear map, no residual."""
    path = folder / "config.json"
    cfg = _read(path)
    activation = cfg.get("activation_function", IDENTITY)
    if activation != IDENTITY:
        raise ValueError(f"unsupported Dense activation {activation!r} in {path}: only Identity")
    if cfg.get("use_residual"):
        raise ValueError(f"unsupported Dense use_residual in {path}")
    return DenseModule(folder, cfg["in_features"], cfg["out_features"], cfg.get("bias", True))


def _is_pylate(entry: dict[str, Any], extra: dict[str, Any]) -> bool:
    """A PyLate ColBERT pipeline: its Dense class, or its config's MaxSim and query keys."""
    return str(entry.get("type", "")).startswith("pylate.") or (
        extra.get("similarity_fn_name") == "MaxSim" or "query_length" in extra
    )


def read_config(folder: Path) -> SentenceTransformersConfig:
    pool_cfg = folder / "1_Pooling" / "config.json"
    normalize = pooled = False
    dense: list[DenseModule] = []
    splade: SpladeModule | None = None
    colbert: ColbertModule | None = None
    st = folder / "config_sentence_transformers.json"
    extra = _read(st) if st.exists() else {}
    modules = folder / "modules.json"
    if modules.exists():
        for entry in sorted(_read(modules), key=lambda e: e.get("idx", 0)):
            kind = entry.get("type", "").rsplit(".", 1)[-1]
            if kind not in SUPPORTED_MODULES:
                raise ValueError(
                    f"{modules}: module {entry.get('type')!r} ({entry.get('path')}) is not "
                    f"supported; headwise reproduces {', '.join(SUPPORTED_MODULES)}"
                )
            if kind == "Pooling":
                pool_cfg = folder / entry.get("path", "1_Pooling") / "config.json"
            pooled = pooled or kind == "Pooling"
            if kind == "SpladePooling":
                splade = splade_module(folder / entry.get("path", ""))
            if kind == "Dense" and not pooled and _is_pylate(entry, extra):
                if colbert is not None:
                    raise ValueError(f"{modules}: more than one token-level Dense module")
                settings = {k: extra[k] for k in COLBERT_KEYS if k in extra}
                colbert = ColbertModule(token_dense_module(folder / entry["path"]), settings)
                continue
            if kind == "Dense":
                if normalize or not pooled:
                    raise ValueError(
                        f"{modules}: a Dense module goes between Pooling and Normalize"
                    )
                dense.append(dense_module(folder / entry["path"]))
            normalize = normalize or kind == "Normalize"
    for before, after in zip(dense, dense[1:], strict=False):
        if before.out_features != after.in_features:
            raise ValueError(
                f"{after.folder}: in_features {after.in_features} does not follow "
                f"{before.folder}'s out_features {before.out_features}"
            )
    pooling = pooling_mode(pool_cfg) if pool_cfg.exists() else None
    sbert = folder / "sentence_bert_config.json"
    max_length = _read(sbert).get("max_seq_length") if sbert.exists() else None
    prompts = extra.get("prompts") or {}
    default_prompt = extra.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ValueError(f"{st}: default_prompt_name {default_prompt!r} is not among the prompts")
    return SentenceTransformersConfig(
        pooling, normalize, max_length, dict(prompts), default_prompt, tuple(dense), splade, colbert
    )
