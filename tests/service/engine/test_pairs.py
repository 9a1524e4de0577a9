"""Pairs cut as the tokenizer cuts them ("longest_first"), without computing their overflow."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from service.engine.pairs import PairTruncation, longest_first


@pytest.mark.parametrize(
    ("first", "second"),
    [  # Hugging Face tokenizers' own cases (utils/truncation.rs, max_length 7)
        ((0, 0), (0, 0)),
        ((0, 8), (0, 7)),
        ((2, 8), (2, 5)),
        ((4, 4), (3, 4)),
        ((4, 8), (3, 4)),
        ((8, 2), (5, 2)),
        ((8, 4), (4, 3)),
        ((8, 8), (3, 4)),
    ],
)
def test_longest_first_keeps_what_the_tokenizer_keeps(first, second):
    assert longest_first(*first, 7) == second


@pytest.mark.parametrize("kind", ["wordpiece", "wordpiece-s", "bpe", "unigram"])
@pytest.mark.parametrize("max_length", [16, 40])
def test_every_pair_equals_the_tokenizers_own_truncation(family_tokenizers, kind, max_length):
    """Random queries and documents, short and long, each side longer than the other: the same
    ids, type ids and cut flag as the tokenizer with truncation on."""
    path = str(family_tokenizers[kind])
    truncating = Tokenizer.from_file(path)
    truncating.no_padding()
    truncating.enable_truncation(max_length)
    cut = PairTruncation(path, max_length, truncating)
    rng = random.Random(max_length)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "warm",
        "mat",
        "while",
        "dogs",
        "ran",
        "far",
        "away",
        "under",
        "grey",
        "skies",
    ]
    pairs = [
        (
            " ".join(rng.choices(words, k=rng.randint(1, 30))),
            " ".join(rng.choices(words, k=rng.randint(0, 60))),
        )
        for _ in range(200)
    ]
    expected = [(e.ids, e.type_ids, bool(e.overflowing)) for e in truncating.encode_batch(pairs)]
    got = cut(pairs)
    assert got == expected
    assert any(c for _, _, c in got) and not all(c for _, _, c in got)
