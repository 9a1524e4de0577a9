"""A Qwen-style tokenizer.json, trained offline: byte-level BPE behind Qwen2's pre-tokenizer
regex, the chat special tokens (<|endoftext|>, <|im_start|>, <|im_end|>) and <think> tags,
"yes" and "no" as tokens of their own (Qwen3-Reranker reads their logits).

kind "reranker": Qwen3's post-processor, which adds nothing to a text (Qwen3-Reranker).
kind "embedder": Qwen3-Embedding's, which appends <|endoftext|> to every text (its last token
is what last-token pooling reads), and whose tokenizer_config pads on the left.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import training_corpus

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>"]
EOS = "<|endoftext|>"
CARD_TEXT = [
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".',
    "Given a web search query, retrieve relevant passages that answer the query",
    "<Instruct>: <Query>: <Document>: system user assistant",
    "Instruct: Query: what is the capital of China? Explain gravity",
]


def corpus(extra: list[str] | None = None) -> list[str]:
    answers = ["yes", "no", "yes\n", "no\n", "yes.", "no."] * 20
    return training_corpus() + CARD_TEXT * 10 + answers + (extra or [])


def write_qwen_tokenizer(
    folder: Path,
    kind: str = "reranker",
    vocab_size: int = 700,
    max_length: int | None = None,
    extra: list[str] | None = None,
) -> int:
    """tokenizer.json (and tokenizer_config.json) in `folder`; returns the vocabulary size.
    extra: more training text (the benchmark's, so that its texts take as many tokens as a
    real vocabulary gives them)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(extra), trainer)
    tok.add_tokens(ADDED)
    assert tok.token_to_id("yes") is not None and tok.token_to_id("no") is not None
    eos = tok.token_to_id(EOS)
    if kind == "embedder":
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A:0 {EOS}:0",
            pair=f"$A:0 {EOS}:0 $B:1 {EOS}:1",
            special_tokens=[(EOS, eos)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": EOS,
        "padding_side": "left" if kind == "embedder" else "right",
    }
    if max_length:
        config["model_max_length"] = max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.get_vocab_size()
