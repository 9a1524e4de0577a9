"""What sentence-transformers would do with a model folder: its module configs, read as data.

modules.json lists the pipeline (Transformer -> Pooling -> Normalize); 1_Pooling/config.json
names the pooling mode; sentence_bert_config.json the max length; config_sentence_transformers
.json the prompts. A pipeline with a module we do not reproduce (Dense, …) is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")
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
class SentenceTransformersConfig:
    pooling: str | None = None  # None: the folder has no Pooling module
    normalize: bool = False  # the pipeline ends with Normalize
    max_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def _read(path: Path) -> dict:
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
    return modes[0]


def read_config(folder: Path) -> SentenceTransformersConfig:
    pool_cfg = folder / "1_Pooling" / "config.json"
    normalize = False
    modules = folder / "modules.json"
    if modules.exists():
        for entry in _read(modules):
            kind = entry.get("type", "").rsplit(".", 1)[-1]
            if kind not in SUPPORTED_MODULES:
                raise ValueError(
                    f"{modules}: module {entry.get('type')!r} ({entry.get('path')}) is not "
                    f"supported; headwise reproduces {', '.join(SUPPORTED_MODULES)}"
                )
            if kind == "Pooling":
                pool_cfg = folder / entry.get("path", "1_Pooling") / "config.json"
            normalize = normalize or kind == "Normalize"
    pooling = pooling_mode(pool_cfg) if pool_cfg.exists() else None
    sbert = folder / "sentence_bert_config.json"
    max_length = _read(sbert).get("max_seq_length") if sbert.exists() else None
    st = folder / "config_sentence_transformers.json"
    extra = _read(st) if st.exists() else {}
    prompts = extra.get("prompts") or {}
    default_prompt = extra.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ValueError(f"{st}: default_prompt_name {default_prompt!r} is not among the prompts")
    return SentenceTransformersConfig(pooling, normalize, max_length, dict(prompts), default_prompt)
