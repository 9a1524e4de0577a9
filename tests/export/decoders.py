"""Random-weight checkpoints shaped as the Qwen3 decoders ship, and their references.

- an embedder as Qwen3-Embedding is published: Qwen3Model, a tokenizer that appends
  <|endoftext|>, sentence-transformers' last-token Pooling and Normalize, the query prompt
  "Instruct: ...\\nQuery:" (the reference: sentence-transformers itself, one text at a time);
- a reranker as Qwen3-Reranker: Qwen3ForCausalLM, scored by its model card's code (prefix,
  formatted pair cut to fit, suffix; softmax of the last position's "no"/"yes" logits);
- a classifier: Qwen3ForSequenceClassification (transformers' logits).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from export.templates import QWEN3_RERANKER
from tests.models.checkpoints import save_checkpoint, write_st_modules
from tests.models.qwen_tokenizer import write_qwen_tokenizer

MAX_LENGTH = 96  # the tokenizers' model_max_length: under the 256 positions, so it decides
# The reranker's: its template's prefix and suffix take 53 tokens of it.
RERANK_MAX_LENGTH = 160
CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
NO_CACHE = {"use_cache": False}


def save(
    folder: Path,
    model_class: str,
    kind: str,
    max_length: int | None = None,
    corpus: list[str] | None = None,
    **extra,
) -> torch.nn.Module:
    """extra: Qwen3Config values over CONFIG's; corpus: more tokenizer training text."""
    folder.mkdir(parents=True, exist_ok=True)
    if max_length is None:
        max_length = MAX_LENGTH if kind == "embedder" else RERANK_MAX_LENGTH
    vocab_size = 1500 if corpus is None else 8000
    vocab = write_qwen_tokenizer(folder, kind, vocab_size, max_length, corpus)
    keep = {f: (folder / f).read_bytes() for f in ("tokenizer.json", "tokenizer_config.json")}
    pad = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<|endoftext|>")
    config = {"vocab_size": vocab, "pad_token_id": pad, **CONFIG, **extra}  # extra: shapes too
    hf = save_checkpoint(folder, model_class, "Qwen3Config", **config)
    for name, data in keep.items():  # save_checkpoint writes a word-level tokenizer.json
        (folder / name).write_bytes(data)
    return hf


def save_embedder(folder: Path, **extra) -> torch.nn.Module:
    hf = save(folder, "Qwen3Model", "embedder", **extra)
    (folder / "1_Pooling").mkdir()
    width = extra.get("hidden_size", CONFIG["hidden_size"])
    (folder / "1_Pooling/config.json").write_text(
        json.dumps({"word_embedding_dimension": width, "pooling_mode_lasttoken": True})
    )
    write_st_modules(
        folder, [("Transformer", ""), ("Pooling", "1_Pooling"), ("Normalize", "2_Normalize")]
    )
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": QUERY_PROMPT, "document": ""}})
    )
    return hf


def sentence_transformers_reference(folder: Path, texts: list[str], **kw) -> np.ndarray:
    """sentence-transformers' own pipeline on the checkpoint folder, one text at a time (so no
    padding: its tokenizer pads on the left, where positions shift with the padding)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(
        str(folder), device="cpu", model_kwargs={"attn_implementation": "eager"}
    )
    return np.stack([st.encode([t], convert_to_numpy=True, **kw)[0] for t in texts])


def card_scores(
    hf: torch.nn.Module,
    folder: Path,
    pairs: list[tuple[str, str]],
    instruction: str | None = None,
    max_length: int = RERANK_MAX_LENGTH,
) -> np.ndarray:
    """Qwen3-Reranker's model card, pair by pair (no padding): the prefix and suffix tokens
    around the formatted pair, itself truncated to what they leave of max_length; the score is
    softmax([z_no, z_yes])[1] at the last position."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    t = QWEN3_RERANKER
    prefix = tok.encode(t.prefix, add_special_tokens=False).ids
    suffix = tok.encode(t.suffix, add_special_tokens=False).ids
    tok.enable_truncation(max_length - len(prefix) - len(suffix))
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    scores = []
    for query, doc in pairs:
        text = t.format.format(instruction=instruction or t.instruction, query=query, document=doc)
        ids = torch.tensor([prefix + tok.encode(text).ids + suffix])
        with torch.no_grad():
            z = hf(input_ids=ids, **NO_CACHE).logits[0, -1]
        scores.append(torch.softmax(torch.stack([z[no], z[yes]]), 0)[1].item())
    return np.array(scores)
