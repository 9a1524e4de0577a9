"""Random-weight checkpoints made with transformers' own classes, and the comparisons every
family's parity tests make against them.

Weights are re-drawn with std 0.1 (norm scales around 1), so attention maps are far from
uniform and a wrong mask, scale or position cannot hide inside the tolerance. Vocabularies
are tiny and the tokenizer.json is a plain word-level one: the parity tests feed ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

TOLERANCE = 1e-4
VOCAB = 100
PAD = 0


def write_tokenizer(folder: Path, vocab_size: int = VOCAB) -> Path:
    """A word-level tokenizer.json with `vocab_size` entries (load_pretrained needs one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def reinit(model: nn.Module, seed: int = 0, std: float = 0.1) -> nn.Module:
    """Every parameter ~ N(0, std); LayerNorm and RMSNorm scales ~ 1 + N(0, std). (Gemma's
    RMSNorm stores its scale as an offset from 1, so N(0, std) is already around 1 there. A
    Qwen3 RMSNorm at N(0, 0.1) scaled its q/k to a tenth: attention all but uniform, and an
    occluded word moved a reranker's score by 1e-4, the tolerance itself.)"""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                noise = torch.randn(p.shape, generator=g) * std
                kind = type(module).__name__
                norm = isinstance(module, nn.LayerNorm) or (
                    kind.endswith("RMSNorm") and not kind.startswith("Gemma")
                )
                scale = norm and name == "weight"
                p.copy_(noise + 1.0 if scale else noise)
    return model.eval()


def save_checkpoint(
    folder: Path, model_class: str, config_class: str, seed: int = 0, **config
) -> nn.Module:
    """transformers' `model_class` built from `config_class(**config)`, eager attention,
    re-initialised, saved with save_pretrained and a tokenizer.json; returns the model."""
    import transformers

    cfg = getattr(transformers, config_class)(**config)
    cls = getattr(transformers, model_class)
    model = reinit(cls._from_config(cfg, attn_implementation="eager"), seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, cfg.vocab_size)
    return model


def batch(lengths: list[int], side: str = "right", seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random ids (never the pad id) padded to the longest length on `side`: ids, mask (B, N)."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.full((len(lengths), n), PAD, dtype=torch.long)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(0, length) if side == "right" else slice(n - length, n)
        ids[row, span] = torch.randint(3, VOCAB, (length,), generator=g)
        mask[row, span] = 1
    return ids, mask


@dataclass
class Diffs:
    hidden: float  # max |ours - theirs| over real tokens of the last layer
    attention: float  # max over layers, heads, real query rows, all keys

    def check(self) -> None:
        assert self.hidden < TOLERANCE, f"hidden states differ by {self.hidden:.3g}"
        assert self.attention < TOLERANCE, f"attention maps differ by {self.attention:.3g}"


def real_rows(x: Tensor, mask: Tensor) -> Tensor:
    """x (B, N, …) or (B, h, N, N) keeping only positions whose query is a real token."""
    if x.dim() == 4:  # (B, h, N_q, N_k): padding queries' rows are undefined, drop them
        return x.permute(0, 2, 1, 3)[mask.bool()]  # (real tokens, h, N_k)
    return x[mask.bool()]  # (real tokens, d)


def diffs(
    ours_hidden: Tensor,
    ours_attn: tuple[Tensor, ...],
    theirs_hidden: Tensor,
    theirs_attn: tuple[Tensor, ...],
    mask: Tensor,
) -> Diffs:
    """Padding queries are left out: transformers gives a row with no allowed key a uniform
    row over all N keys, ours a finite one of its own; neither reaches a real token."""
    assert len(ours_attn) == len(theirs_attn)
    hidden = (real_rows(ours_hidden, mask) - real_rows(theirs_hidden, mask)).abs().max()
    attention = max(
        (real_rows(a, mask) - real_rows(b, mask)).abs().max().item()
        for a, b in zip(ours_attn, theirs_attn, strict=True)
    )
    return Diffs(hidden.item(), attention)


def ours(model: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Our encoder's last hidden state and every layer's probabilities, explicit path."""
    with torch.no_grad():
        out = model.encoder(ids, mask, need_weights=True)
    return out.hidden, out.attentions


def theirs(model: nn.Module, ids: Tensor, mask: Tensor, **kw) -> tuple[Tensor, tuple]:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True, **kw)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else None
    return hidden, out.attentions


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """sentence-transformers' mean pooling, written out independently of models/pooling.py."""
    m = mask[:, :, None].float()
    return (hidden * m).sum(1) / m.sum(1)


def write_st_modules(folder: Path, kinds: list[tuple[str, str]]) -> None:
    """modules.json for (type, path) entries, e.g. ("Pooling", "1_Pooling")."""
    modules = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
        for i, (k, p) in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
